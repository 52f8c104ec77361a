"""Upgrades (spark_jobs.upgrade): an edited output rebuilt from the accepted rows beside its live
sink and swapped in one step, killed and continued, rolled back to its savepoint."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from edited_streams import (
    EVENT_INTERVAL_MS,
    HOT,
    edit,
    files_under,
    in_session,
    run_beside,
    start,
    verdicts,
    window,
)
from edited_streams import ran as ran  # noqa: F401 - the fixtures
from edited_streams import stream as stream  # noqa: F401
from examples import example_spec, include_with

from runner.testdata import generate
from spark_jobs import changes, frames, stream_job, upgrade
from spark_jobs.analysis import resolve_plan
from spark_jobs.plan import compile_plan
from spark_jobs.runtime import archive, staging
from spark_jobs.runtime.checkpoint import (
    batch_ids,
    batch_watermark_ms,
    landing_backlog,
    last_batch,
    previous_plan,
    processed_files,
    query_id,
    read_query_checkpoint,
    sink_files,
    unread_accepted_files,
)
from spark_jobs.runtime.clock import from_ms
from spark_jobs.runtime.progress import read_events
from spark_jobs.sinks.table import open_database
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec

WINDOW = "site_temperature_10m"
TABLE = "device_status"
FIFTEEN = {"duration": "15 minutes", "slide": "5 minutes"}


def run_upgrade(spark, spec_file: Path, data: Path, monkeypatch, *args: str) -> int:
    in_session(spark, monkeypatch)
    return upgrade.main(["--spec", str(spec_file), "--data-root", str(data), *args])


def layout_of(spec_file: Path, data: Path) -> Layout:
    return Layout(load_spec(spec_file), data, spec_file.parent)


def sink_rows(path: str) -> list[dict]:
    """A Parquet sink's rows as a reader that honours its log reads them (pyarrow, no Spark)."""
    files = sorted(sink_files(path))
    return [row for f in files for row in pq.read_table(f.removeprefix("file:")).to_pylist()]


def window_rows(rows: list[dict]) -> set[tuple]:
    return {(r["window_start"], r["window_end"], r["site"], r["readings"], round(r["avg_temperature"], 6),
             r["max_temperature"]) for r in rows}


def expected_windows(spark, spec_file: Path, data: Path) -> set[tuple]:
    """The window output's query over every accepted row, as a batch: the windows its live checkpoint's
    last watermark closed."""
    spec = load_spec(spec_file)
    layout = Layout(spec, data, spec_file.parent)
    plan = resolve_plan(spark, spec, layout)
    output = plan.output(WINDOW)
    checkpoint = output.checkpoint
    watermark = from_ms(batch_watermark_ms(checkpoint, last_batch(checkpoint, "commits"))).replace(tzinfo=None)
    rows = frames.output_frame(frames.accepted_batch(spark, plan.ingestion), plan, output).collect()
    return window_rows([r.asDict() for r in rows if r["window_end"] <= watermark])


def durations(rows: list[dict]) -> set[timedelta]:
    return {r["window_end"] - r["window_start"] for r in rows}


def table_rows(layout: Layout, table: str) -> list[tuple]:
    database = open_database(f"sqlite:///{layout.data_root / 'tables.db'}")
    with database.connect() as conn:
        return sorted(conn.execute(f'SELECT * FROM "{table}"').fetchall())


def test_a_window_edited_in_place_is_rebuilt_beside_its_sink_swapped_in_one_step_and_resumed(
        spark, stream, monkeypatch) -> None:
    spec_file, data = stream
    layout = layout_of(spec_file, data)
    live = layout.data(f"sinks/sensors/{WINDOW}")
    old = sink_rows(live)
    assert durations(old) == {timedelta(minutes=10)}
    edit(spec_file, lambda d: window(d, window=FIFTEEN))
    assert verdicts(spec_file, data)[WINDOW].verdict == changes.REBUILD

    seen: list[tuple[set, int]] = []  # what a reader polling the live sink saw: window sizes, row count
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            try:
                rows = sink_rows(live)
            except FileNotFoundError:  # a read in flight at the exchange fails, as any reader's may: read again
                continue
            seen.append((durations(rows), len(rows)))

    reader = threading.Thread(target=poll, daemon=True)
    reader.start()
    try:
        assert run_upgrade(spark, spec_file, data, monkeypatch) == upgrade.EXIT_OK
    finally:
        done.set()
        reader.join(30)
    record = upgrade.latest(layout)
    assert record["phase"] == upgrade.DONE and record["rebuild"] == [WINDOW]
    new = sink_rows(live)
    assert window_rows(new) == expected_windows(spark, spec_file, data) and durations(new) == {timedelta(minutes=15)}
    # never a mix: each read saw the old complete result or the new one
    assert {(frozenset(d), n) for d, n in seen} <= {(frozenset({timedelta(minutes=10)}), len(old)),
                                                    (frozenset({timedelta(minutes=15)}), len(new))}, seen
    assert seen[0][1] == len(old)
    # the old result kept beside it, its log naming the live path (where a rollback puts it back)
    staged = Path(record["outputs"][WINDOW]["staged"])
    kept = [row for f in sink_files(staged) for row in pq.read_table(staged / Path(f).name).to_pylist()]
    assert window_rows(kept) == window_rows(old) and all(live in f for f in sink_files(staged))
    # the plan the checkpoints hold is recorded: the stream starts, and goes on with the new windows
    assert verdicts(spec_file, data)[WINDOW].verdict == changes.UNCHANGED
    assert generate.main(["--spec", str(spec_file), "--data-root", str(data), "--files", "3",
                          "--events-per-file", "25", "--seed", "9", "--event-interval-ms", str(EVENT_INTERVAL_MS)]) == 0
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_OK
    after = sink_rows(live)
    assert len(after) > len(new) and durations(after) == {timedelta(minutes=15)}
    assert window_rows(after) == expected_windows(spark, spec_file, data)
    # what the upgrade keeps for a rollback, cleaned up: never the newest's unless asked, never the live sink
    rollback_kept = Path(record["folder"]) / "savepoint" / "checkpoints" / WINDOW
    assert upgrade.main(["--spec", str(spec_file), "--data-root", str(data), "--clean"]) == upgrade.EXIT_OK
    assert staged.exists() and rollback_kept.exists()
    live_files = files_under(Path(live))
    assert upgrade.main(["--spec", str(spec_file), "--data-root", str(data), "--clean", "--keep", "0"]) == upgrade.EXIT_OK
    assert not staged.exists() and not rollback_kept.exists() and files_under(Path(live)) == live_files
    assert upgrade.latest(layout)["cleaned_at"]
    assert run_upgrade(spark, spec_file, data, monkeypatch, "--rollback") == upgrade.EXIT_REFUSED


def test_a_grouping_key_added_to_the_update_table_is_rebuilt_and_swapped_in_one_transaction(
        spark, stream, monkeypatch) -> None:
    spec_file, data = stream
    layout = layout_of(spec_file, data)
    table = "sensors_device_status"
    old = table_rows(layout, table)

    def regroup(d: dict) -> None:
        (out,) = [o for o in d["outputs"] if o["name"] == TABLE]
        out["query"]["group_by"] = ["device_id", "event_date"]

    edit(spec_file, regroup)
    assert verdicts(spec_file, data)[TABLE].verdict == changes.REBUILD
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_BAD_SPEC  # as a bare start refuses it
    assert run_upgrade(spark, spec_file, data, monkeypatch) == upgrade.EXIT_OK
    spec = load_spec(spec_file)
    plan = resolve_plan(spark, spec, layout)
    expected = frames.output_frame(frames.accepted_batch(spark, plan.ingestion), plan, plan.output(TABLE))
    database = open_database(f"sqlite:///{layout.data_root / 'tables.db'}")
    with database.connect() as conn:
        got = conn.execute(f'SELECT device_id, event_date, readings FROM "{table}"').fetchall()
    assert sorted(got) == sorted((r["device_id"], r["event_date"].isoformat(), r["readings"])
                                 for r in expected.collect())  # its query over every accepted row
    with database.connect() as conn:
        assert database.describe(conn, table)[1] == ["device_id", "event_date"]
    assert table_rows(layout, upgrade.before_table(table, 1)) == old  # the old table kept under another name
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_OK
    assert upgrade.main(["--spec", str(spec_file), "--data-root", str(data), "--clean", "--keep", "0"]) == upgrade.EXIT_OK
    with database.connect() as conn:  # the old table dropped, the live one kept
        assert database.describe(conn, upgrade.before_table(table, 1)) is None
        assert database.describe(conn, table) is not None


def test_a_rollback_puts_every_checkpoint_sink_table_and_the_plan_back(spark, stream, monkeypatch) -> None:
    spec_file, data = stream
    layout = layout_of(spec_file, data)
    checkpoints = Path(layout.checkpoint_root)
    sinks = Path(layout.data("sinks/sensors"))
    before = {"checkpoints": {p.name: files_under(p) for p in checkpoints.iterdir() if not p.name.startswith("_")},
              "sinks": files_under(sinks), "plan": layout.plan_file.read_bytes(),
              "table": table_rows(layout, "sensors_device_status")}
    original = spec_file.read_text()
    edit(spec_file, lambda d: (window(d, window=FIFTEEN), [o["query"].update(group_by=["device_id", "event_date"])
                                                           for o in d["outputs"] if o["name"] == TABLE]))
    assert run_upgrade(spark, spec_file, data, monkeypatch) == upgrade.EXIT_OK
    assert upgrade.latest(layout)["rebuild"] == [WINDOW, TABLE]
    assert files_under(sinks) != before["sinks"]
    assert run_upgrade(spark, spec_file, data, monkeypatch, "--rollback") == upgrade.EXIT_OK
    assert upgrade.latest(layout)["phase"] == upgrade.ROLLED_BACK
    assert {p.name: files_under(p) for p in checkpoints.iterdir() if not p.name.startswith("_")} == before["checkpoints"]
    assert files_under(sinks) == before["sinks"]  # byte for byte, the old folders back in place
    assert layout.plan_file.read_bytes() == before["plan"]
    assert table_rows(layout, "sensors_device_status") == before["table"]
    # the stream runs the spec it ran before, pinned, while the file still says otherwise
    assert upgrade.pin_file(layout).read_text() == original
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_OK
    assert durations(sink_rows(layout.data(f"sinks/sensors/{WINDOW}"))) == {timedelta(minutes=10)}
    assert verdicts(spec_file, data)[WINDOW].verdict == changes.REBUILD  # the file's change still waits
    spec_file.write_text(original)  # the edit undone: the pin goes
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_OK
    assert not upgrade.pin_file(layout).exists()


def run_afresh(spark, spec_file: Path, data: Path, fresh: Path, monkeypatch) -> Path:
    """The oracle of a reprocess: the spec run afresh, in ``fresh``, over every input file (landed and archived)."""
    plan = compile_plan(load_spec(spec_file), layout_of(spec_file, data))
    landing, archived = Path(plan.source.landing), Path(plan.source.archive_path)
    (fresh / landing.relative_to(data)).mkdir(parents=True)
    for path in [*landing.iterdir(), *(archived.iterdir() if archived.exists() else [])]:
        shutil.copy2(path, fresh / landing.relative_to(data) / path.name)
    assert start(spark, spec_file, fresh, monkeypatch) == stream_job.EXIT_OK
    return fresh


def rows(folder: Path) -> list[tuple]:
    """A Parquet table's rows, a quarantined row's file by its name (a fresh run's folder is another)."""
    return sorted(tuple(sorted((k, Path(v).name if k == "source_file" else str(v)) for k, v in r.items()
                               if k != "quarantined_at")) for r in sink_rows(str(folder)))


def test_a_deduplication_key_changed_is_reprocessed_from_the_archived_and_landed_input_and_rolled_back(
        spark, stream, monkeypatch, tmp_path) -> None:
    from spark_jobs.stream_spec.models import INGEST_FLOW

    spec_file, data = stream
    layout = layout_of(spec_file, data)
    plan = compile_plan(load_spec(spec_file), layout)
    landing, archived = Path(plan.source.landing), Path(plan.source.archive_path)
    assert archive.archive(plan, now=time.time() + 3600).archived  # part of the input is in the archive
    inputs = sorted(p.name for p in [*landing.iterdir(), *archived.iterdir()])
    readings, quarantine = Path(layout.data("sinks/sensors/readings")), Path(layout.data("quarantine/sensors"))
    tables = [readings, quarantine, Path(layout.data(f"sinks/sensors/{WINDOW}")), Path(layout.data("sinks/sensors/hot"))]
    before = {"tables": [files_under(t) for t in tables], "ingestion": query_id(plan.checkpoint(INGEST_FLOW)),
              "status": table_rows(layout, "sensors_device_status")}
    edit(spec_file, lambda d: d["deduplicate"].update(key=["device_id", "ts"]))
    assert verdicts(spec_file, data)[INGEST_FLOW].verdict == changes.REPROCESS

    assert run_upgrade(spark, spec_file, data, monkeypatch) == upgrade.EXIT_OK
    record = upgrade.latest(layout)
    assert record["phase"] == upgrade.DONE and record["rebuild"] == [INGEST_FLOW, WINDOW, TABLE, "hot"]
    assert not Path(record["ingestion"]["replay"]).exists() and sorted(
        p.name for p in [*landing.iterdir(), *archived.iterdir()]) == inputs  # the input never moved
    fresh = run_afresh(spark, spec_file, data, tmp_path / "fresh", monkeypatch)
    for table in tables:
        assert rows(table) == rows(fresh / table.relative_to(data)), table
    assert table_rows(layout, "sensors_device_status") == table_rows(layout_of(spec_file, fresh), "sensors_device_status")
    keys = [(r["device_id"], r["ts"]) for r in sink_rows(str(readings))]
    assert len(keys) == len(set(keys)) and rows(readings) != [] and files_under(readings) != before["tables"][0]
    assert {Path(r["source_file"].removeprefix("file:")).parent for r in sink_rows(str(quarantine))} == {landing}
    ingestion = plan.checkpoint(INGEST_FLOW)
    assert query_id(ingestion) == record["ingestion"]["query"] != before["ingestion"]
    assert {str(landing) in p for p in processed_files(ingestion)} == {True}  # its log names the landing folder
    assert any(e.get("event") == "ingested" and e.get("id") == record["ingestion"]["query"]
               for e in read_events(layout.events_file))  # its accounting from its first batch

    # rolled back: every table, checkpoint and the status table as they were
    assert run_upgrade(spark, spec_file, data, monkeypatch, "--rollback") == upgrade.EXIT_OK
    assert [files_under(t) for t in tables] == before["tables"] and query_id(ingestion) == before["ingestion"]
    assert table_rows(layout, "sensors_device_status") == before["status"]

    # carried out again, then the stream goes on: it reads only what landed since
    assert run_upgrade(spark, spec_file, data, monkeypatch) == upgrade.EXIT_OK
    assert verdicts(spec_file, data)[INGEST_FLOW].verdict == changes.UNCHANGED
    replayed = processed_files(ingestion)
    assert generate.main(["--spec", str(spec_file), "--data-root", str(data), "--files", "2", "--events-per-file", "25",
                          "--seed", "11", "--event-interval-ms", str(EVENT_INTERVAL_MS)]) == 0
    new_files = sorted(set(p.name for p in landing.iterdir()) - set(inputs))
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_OK
    assert sorted(Path(p).name for p in processed_files(ingestion) - replayed) == new_files
    keys = [(r["device_id"], r["ts"]) for r in sink_rows(str(readings))]
    assert len(keys) == len(set(keys)) > len(rows(fresh / "sinks/sensors/readings"))


def test_a_checkpoint_removed_by_hand_with_its_tables_kept_is_refused_then_read_again_by_the_upgrade(
        spark, stream, monkeypatch, tmp_path) -> None:
    """Checkpoints (and the plans kept with them) removed by hand, the tables kept: a start there
    would have Spark's file sinks skip the new queries' first batches (their logs record those ids)
    and the tables take rows twice. Refused, nothing written; the upgrade reads the input again into
    new tables and swaps them in, equal to a fresh run."""
    from spark_jobs.stream_spec.models import INGEST_FLOW

    spec_file, data = stream
    layout = layout_of(spec_file, data)
    tables = [Path(layout.data(f"sinks/sensors/{name}")) for name in ("readings", WINDOW, "hot")] + [
        Path(layout.data("quarantine/sensors"))]
    before = [files_under(t) for t in tables], table_rows(layout, "sensors_device_status")
    shutil.rmtree(layout.checkpoint_root)
    found = verdicts(spec_file, data)
    assert found[INGEST_FLOW].verdict == changes.REPROCESS, found[INGEST_FLOW].text()
    assert "readings/_spark_metadata records batches 0 to" in found[INGEST_FLOW].text()
    assert {f: v.verdict for f, v in found.items() if f != INGEST_FLOW} == {  # (the ingestion writes readings)
        "readings": changes.REPROCESS, WINDOW: changes.REBUILD, TABLE: changes.REBUILD, "hot": changes.REBUILD}, \
        changes.report(found.values())
    assert "sink.table" in found[TABLE].text() and "no plan or checkpoint of an earlier start" in found["hot"].text()
    # a crash in a first batch leaves it planned, not committed: its replay skips what the tables hold, so it starts
    planned = Path(layout.checkpoint_root, INGEST_FLOW, "offsets")
    planned.mkdir(parents=True)
    (planned / "0").write_text("v1\n")
    assert verdicts(spec_file, data)[INGEST_FLOW].verdict == changes.NEW
    shutil.rmtree(layout.checkpoint_root)
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_BAD_SPEC
    assert ([files_under(t) for t in tables], table_rows(layout, "sensors_device_status")) == before

    assert run_upgrade(spark, spec_file, data, monkeypatch) == upgrade.EXIT_OK
    assert {f: v.verdict for f, v in verdicts(spec_file, data).items() if v.verdict != changes.UNCHANGED} == {}
    fresh = run_afresh(spark, spec_file, data, tmp_path / "fresh", monkeypatch)
    for table in tables:
        assert rows(table) == rows(fresh / table.relative_to(data)) != [], table
    assert table_rows(layout, "sensors_device_status") == table_rows(layout_of(spec_file, fresh), "sensors_device_status")


@pytest.mark.parametrize("moment", ["after the sink's exchange", "before the plan is recorded"])
def test_an_upgrade_killed_at_any_step_is_finished_by_the_next_run(spark, stream, monkeypatch, moment: str) -> None:
    spec_file, data = stream
    layout = layout_of(spec_file, data)
    edit(spec_file, lambda d: window(d, window=FIFTEEN))

    class Killed(BaseException):
        pass

    def kill(*_: object, **__: object) -> None:
        raise Killed(moment)

    with monkeypatch.context() as m:
        if moment == "after the sink's exchange":
            calls = []
            real = upgrade.exchange

            def exchange_once(a, b):  # the sink's exchange, then a kill instead of the checkpoint's
                calls.append(a)
                if len(calls) > 1:
                    kill()
                return real(a, b)

            m.setattr(upgrade, "exchange", exchange_once)
            m.setattr(staging, "exchange", exchange_once)
        else:
            m.setattr(upgrade, "finish", kill)
        with pytest.raises(Killed):
            run_upgrade(spark, spec_file, data, m)
    assert upgrade.latest(layout)["phase"] != upgrade.DONE
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_BAD_SPEC  # no driver beside an unfinished one
    assert run_upgrade(spark, spec_file, data, monkeypatch) == upgrade.EXIT_OK
    assert upgrade.latest(layout)["phase"] == upgrade.DONE and upgrade.latest(layout)["number"] == 1
    live = layout.data(f"sinks/sensors/{WINDOW}")
    assert window_rows(sink_rows(live)) == expected_windows(spark, spec_file, data)
    assert durations(sink_rows(live)) == {timedelta(minutes=15)}
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_OK


def test_a_reprocess_killed_in_its_swap_is_finished_by_the_next_run(spark, stream, monkeypatch) -> None:
    """Killed after the accepted rows' exchange, then (its next run) after the ingestion checkpoint's
    exchange: each run recognises what an earlier one swapped, the third finishes."""
    from spark_jobs import reprocess
    from spark_jobs.stream_spec.models import INGEST_FLOW

    spec_file, data = stream
    layout = layout_of(spec_file, data)
    edit(spec_file, lambda d: d["deduplicate"].update(key=["device_id", "ts"]))

    class Killed(BaseException):
        pass

    def killed_after(exchanges: int) -> list[str]:  # a run of the upgrade killed once it took ``exchanges`` exchanges
        calls: list[str] = []
        real = upgrade.exchange

        def exchange_then_kill(a, b):
            if len(calls) == exchanges:
                raise Killed(exchanges)
            calls.append(b)
            return real(a, b)

        with monkeypatch.context() as m:
            m.setattr(upgrade, "exchange", exchange_then_kill)
            m.setattr(reprocess, "exchange", exchange_then_kill)
            m.setattr(staging, "exchange", exchange_then_kill)
            with pytest.raises(Killed):
                run_upgrade(spark, spec_file, data, m)
        assert upgrade.latest(layout)["phase"] == upgrade.REBUILT
        return calls

    ingestion = Path(layout.checkpoint_root) / INGEST_FLOW
    assert killed_after(1) == [layout.data("sinks/sensors/readings")]  # the accepted rows
    # the next run exchanges the quarantine and the ingestion's checkpoint, not the accepted rows again
    assert killed_after(2) == [layout.data("quarantine/sensors"), str(ingestion)]
    assert run_upgrade(spark, spec_file, data, monkeypatch) == upgrade.EXIT_OK
    assert upgrade.latest(layout)["phase"] == upgrade.DONE and upgrade.latest(layout)["number"] == 1
    readings = sink_rows(layout.data("sinks/sensors/readings"))
    keys = [(r["device_id"], r["ts"]) for r in readings]
    assert len(keys) == len(set(keys)) and keys
    assert window_rows(sink_rows(layout.data(f"sinks/sensors/{WINDOW}"))) == expected_windows(spark, spec_file, data)
    read = processed_files(ingestion)
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_OK  # nothing new: nothing read again
    assert processed_files(ingestion) == read and len(sink_rows(layout.data("sinks/sensors/readings"))) == len(readings)


def test_a_reprocess_whose_process_is_sigkilled_mid_rebuild_is_finished_by_the_next_run(
        spark, stream, monkeypatch, tmp_path) -> None:
    """The upgrade's spark-submit killed with SIGKILL (a crashed worker) while its staged ingestion reads
    the input again: nothing live changed; the next run resumes the staged checkpoint and finishes."""
    import os
    import signal
    import subprocess
    import sys

    from spark_jobs import submit
    from spark_jobs.stream_spec.models import INGEST_FLOW

    spec_file, data = stream
    layout = layout_of(spec_file, data)
    readings = Path(layout.data("sinks/sensors/readings"))
    live_before = files_under(readings)
    edit(spec_file, lambda d: d["deduplicate"].update(key=["device_id", "ts"]))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, TZ="UTC", SPARK_LOCAL_IP="127.0.0.1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    cmd = submit.command("upgrade", spec_file, "local[2]", ["--data-root", str(data)])
    cmd[3:3] = ["--conf", "spark.ui.enabled=false"]
    staged = upgrade.upgrades_dir(layout) / "000001" / "staged" / INGEST_FLOW / "offsets" / "0"
    with open(tmp_path / "upgrade.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            wait(lambda: staged.exists() or proc.poll() is not None, "the staged ingestion's first batch", 180)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(60)
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "upgrade.log").read_text()[-3000:]
    assert upgrade.latest(layout)["phase"] == upgrade.PREPARED and files_under(readings) == live_before
    assert run_upgrade(spark, spec_file, data, monkeypatch) == upgrade.EXIT_OK  # its lease's holder is dead
    assert upgrade.latest(layout)["phase"] == upgrade.DONE and upgrade.latest(layout)["number"] == 1
    keys = [(r["device_id"], r["ts"]) for r in sink_rows(str(readings))]
    assert len(keys) == len(set(keys)) and keys
    assert window_rows(sink_rows(layout.data(f"sinks/sensors/{WINDOW}"))) == expected_windows(spark, spec_file, data)


def test_what_an_upgrade_cannot_carry_out_is_refused_and_nothing_is_written(spark, stream, monkeypatch, caplog) -> None:
    from spark_jobs.runtime.lease import DriverLease

    spec_file, data = stream
    layout = layout_of(spec_file, data)
    before = files_under(data)
    with caplog.at_level("ERROR", logger="upgrade"):
        assert run_upgrade(spark, spec_file, data, monkeypatch) == upgrade.EXIT_REFUSED
    assert "nothing to upgrade" in caplog.text
    assert files_under(data) == before and upgrade.latest(layout) is None
    edit(spec_file, lambda d: window(d, window=FIFTEEN))
    with DriverLease(layout.lease_dir, stream="sensors"):  # a driver runs
        caplog.clear()
        with caplog.at_level("ERROR", logger="upgrade"):
            assert run_upgrade(spark, spec_file, data, monkeypatch) == upgrade.EXIT_REFUSED
    assert "stop it first" in caplog.text and upgrade.latest(layout) is None
    assert previous_plan(layout)  # untouched


def test_a_change_only_a_start_carries_out_is_an_upgrade_of_a_savepoint_then_a_restart(spark, stream, monkeypatch) -> None:
    """A rate limit changed (compatible), an output added (new) and one removed (retired): nothing to
    rebuild, so the upgrade takes its savepoint, its rebuild and swap need no Spark job, and a driver
    that runs the spec before must restart (the DAG's graceful restart) for the change to take
    effect; a driver started from the upgraded spec need not. The start then carries the change out;
    a rollback puts the retired output's archived checkpoint back, so it resumes where it was."""
    from spark_jobs.runtime.lease import DriverLease

    spec_file, data = stream
    layout = layout_of(spec_file, data)
    cold = {"name": "cold", "mode": "append", "sink": {"type": "parquet", "path": "sinks/sensors/cold"},
            "query": {"type": "sql", "sql": "SELECT event_id, temperature FROM accepted WHERE temperature < 20"}}
    hot_checkpoint = Path(layout.checkpoint_root) / "hot"
    hot_batches = batch_ids(str(hot_checkpoint), "commits")
    edit(spec_file, lambda d: (d["source"].update(max_files_per_trigger=3), d["outputs"].append(cold),
                               d["outputs"].remove(HOT)))
    assert run_upgrade(spark, spec_file, data, monkeypatch, "--step", "prepare", "--online") == upgrade.EXIT_OK
    record = upgrade.latest(layout)
    assert record["phase"] == upgrade.PREPARED and record["rebuild"] == []
    assert {v["flow"]: v["verdict"] for v in record["verdicts"] if v["verdict"] != changes.UNCHANGED} == {
        "_ingest": changes.COMPATIBLE, "cold": changes.NEW, "hot": changes.RETIRED}
    plan = compile_plan(load_spec(spec_file), layout)
    assert upgrade.step_without_spark(plan, layout, str(spec_file), "prepare") is None  # a step of the job's
    assert upgrade.step_without_spark(plan, layout, str(spec_file), "rebuild")["phase"] == upgrade.REBUILT
    assert upgrade.step_without_spark(plan, layout, str(spec_file), "swap")["phase"] == upgrade.DONE
    record = upgrade.latest(layout)
    assert upgrade.restart_needed(layout, record) is None  # no driver runs: its next start carries it out
    with DriverLease(layout.lease_dir, stream="sensors"):  # a driver that started from the spec before
        why = upgrade.restart_needed(layout, record)
        assert why is not None and "_ingest (compatible), cold (new), hot (retired)" in why and "plan 1" in why, why
        changes.keep(layout, spec_file, plan, time.time())  # ... and one started from the upgraded spec
        assert upgrade.restart_needed(layout, record) is None
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_OK
    assert {f: v.verdict for f, v in verdicts(spec_file, data).items() if v.verdict != changes.UNCHANGED} == {}
    cold_rows = sorted(r["event_id"] for r in sink_rows(layout.data("sinks/sensors/cold")))
    accepted = sorted(r["event_id"] for r in sink_rows(layout.data("sinks/sensors/readings")) if r["temperature"] < 20)
    assert cold_rows and cold_rows == accepted  # the new output: over every accepted row since the stream began
    assert not hot_checkpoint.exists()  # retired: archived
    cold_sink, cold_checkpoint = Path(layout.data("sinks/sensors/cold")), Path(layout.checkpoint_root) / "cold"
    assert run_upgrade(spark, spec_file, data, monkeypatch, "--rollback") == upgrade.EXIT_OK
    assert batch_ids(str(hot_checkpoint), "commits") == hot_batches  # back where it was
    pinned = upgrade.pinned_spec(layout, spec_file)
    assert pinned is not None and "hot" in {o.name for o in load_spec(pinned).outputs}
    # the added output is set aside, its sink and checkpoint: added again later, it starts clean
    assert not cold_sink.exists() and not cold_checkpoint.exists()
    aside = Path(record["folder"]) / "rolled_back" / "cold"
    assert sorted(r["event_id"] for r in sink_rows(str(aside / "sink"))) == cold_rows
    assert (aside / "checkpoint" / "commits").is_dir()
    assert verdicts(spec_file, data)["cold"].verdict == changes.NEW
    assert f"upgrade {record['number']}: {aside.parent}" in upgrade.clean(plan, layout, keep=0)
    assert not aside.exists()


def test_an_output_added_again_over_its_kept_sink_is_rebuilt_and_a_rollback_gives_that_sink_back(
        spark, stream, monkeypatch) -> None:
    """A removed output's sink is kept; added again, a start there would skip the batches that
    sink's log records (or add to what it holds): it is rebuilt beside it and swapped in, and a
    rollback gives the kept sink back as it was."""
    spec_file, data = stream
    layout = layout_of(spec_file, data)
    hot_sink = Path(layout.data("sinks/sensors/hot"))
    edit(spec_file, lambda d: d["outputs"].remove(HOT))
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_OK  # retired
    kept, kept_rows = files_under(hot_sink), sink_rows(str(hot_sink))
    assert generate.main(["--spec", str(spec_file), "--data-root", str(data), "--files", "2",
                          "--events-per-file", "25", "--seed", "9", "--event-interval-ms", str(EVENT_INTERVAL_MS)]) == 0
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_OK  # more accepted rows meanwhile
    edit(spec_file, lambda d: d["outputs"].append(HOT))
    found = verdicts(spec_file, data)["hot"]
    assert found.verdict == changes.REBUILD, found.text()
    assert "sink.path" in found.text() and "_spark_metadata records batches 0 to" in found.text()
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_BAD_SPEC  # refused, nothing written
    assert files_under(hot_sink) == kept
    assert run_upgrade(spark, spec_file, data, monkeypatch) == upgrade.EXIT_OK
    assert {f: v.verdict for f, v in verdicts(spec_file, data).items() if v.verdict != changes.UNCHANGED} == {}
    accepted = sorted(r["event_id"] for r in sink_rows(layout.data("sinks/sensors/readings")) if r["temperature"] > 25)
    assert sorted(r["event_id"] for r in sink_rows(str(hot_sink))) == accepted  # every accepted row, once
    assert len(accepted) > len(kept_rows)  # (rows accepted since it was removed among them)
    assert run_upgrade(spark, spec_file, data, monkeypatch, "--rollback") == upgrade.EXIT_OK
    assert files_under(hot_sink) == kept


def test_a_driver_on_a_rollback_s_pinned_spec_starts_its_held_outputs_from_the_upgraded_spec(
        spark, stream, monkeypatch) -> None:
    """A driver started after a rollback runs the pinned copy of the spec before, which the next
    upgrade removes: once that upgrade is done, its held outputs are planned from the upgrade's
    spec file (not from the removed copy, which would end the driver)."""
    spec_file, data = stream
    layout = layout_of(spec_file, data)
    pinned = spec_file.parent / "pinned-copy.yaml"  # what the driver runs, gone with the upgrade's unpin
    edit(spec_file, lambda d: window(d, window=FIFTEEN))
    record = {"number": 7, "stream": "sensors", "spec_file": str(spec_file), "spec": spec_file.read_text(),
              "rebuild": [WINDOW]}
    planned: list[tuple] = []
    release = upgrade.Release(layout, record, spark, events=None, spec_file=str(pinned), stop=lambda q: None,
                              replan=lambda names, upgraded: planned.append((names, upgraded)) or ["queries"])
    assert release._upgraded_plan() == ["queries"]
    ((names, upgraded),) = planned
    assert names == [WINDOW] and upgraded.output(WINDOW).query.window.duration == "15 minutes"
    edit(spec_file, lambda d: window(d, window={"duration": "20 minutes", "slide": "5 minutes"}))  # changed again
    assert release._upgraded_plan() is None and len(planned) == 1  # held until the stream restarts


def test_a_window_moved_to_a_delta_table_then_edited_there_is_rebuilt_and_rolled_back_in_one_commit_each(
        spark, stream, monkeypatch) -> None:
    from deltalake import DeltaTable

    spec_file, data = stream
    layout = layout_of(spec_file, data)
    table = layout.data("tables/sensors/site_temperature")

    def delta_rows() -> list[dict]:
        return [r.asDict() for r in spark.read.format("delta").load(table).collect()]

    edit(spec_file, lambda d: window(d) and [o.update(sink={"type": "delta", "path": "tables/sensors/site_temperature"})
                                             for o in d["outputs"] if o["name"] == WINDOW])
    assert run_upgrade(spark, spec_file, data, monkeypatch) == upgrade.EXIT_OK  # a new place: the table is created
    assert window_rows(delta_rows()) == expected_windows(spark, spec_file, data)
    assert durations(delta_rows()) == {timedelta(minutes=10)}
    version = DeltaTable(table).version()
    edit(spec_file, lambda d: window(d, window=FIFTEEN))  # then its window, in place
    assert verdicts(spec_file, data)[WINDOW].verdict == changes.REBUILD
    assert run_upgrade(spark, spec_file, data, monkeypatch) == upgrade.EXIT_OK
    assert DeltaTable(table).version() == version + 1  # one commit: the old rows, then the new ones
    assert window_rows(delta_rows()) == expected_windows(spark, spec_file, data)
    assert durations(delta_rows()) == {timedelta(minutes=15)}
    assert not Path(upgrade.latest(layout)["outputs"][WINDOW]["staged"]).exists()  # the staged table went
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_OK  # and it resumes from the rebuilt one
    assert run_upgrade(spark, spec_file, data, monkeypatch, "--rollback") == upgrade.EXIT_OK
    assert durations(delta_rows()) == {timedelta(minutes=10)} and DeltaTable(table).version() == version + 2


def events_since(layout: Layout, kind: str, began: float) -> list[dict]:
    """The stream's events of ``kind`` logged after ``began``."""
    return [e for e in read_events(layout.events_file) if e.get("event") == kind and e.get("logged_at", 0) > began]


def wait(condition, what: str, seconds: float = 120) -> None:
    """Until ``condition()`` holds; fails saying ``what`` did not happen in ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds}s: {what}"
        time.sleep(0.2)


def feed(spec_file: Path, data: Path, files: int, seed: int) -> None:
    """``files`` more files of 25 events land for the stream."""
    assert generate.main(["--spec", str(spec_file), "--data-root", str(data), "--files", str(files),
                          "--events-per-file", "25", "--seed", str(seed), "--event-interval-ms", str(EVENT_INTERVAL_MS)]) == 0


def step(spec_file: Path, data: Path, *args: str) -> int:
    """One step of the upgrade, as the upgrade DAG submits it (beside a driver in the tests' session)."""
    return upgrade.main(["--spec", str(spec_file), "--data-root", str(data), *args])


def test_an_online_upgrade_holds_the_rebuilt_output_while_the_others_commit_then_starts_it(
        spark, stream, monkeypatch) -> None:
    """Prepared online, the stream runs during the rebuild and the swap: its other outputs commit, the
    window output and the table whose key changed are held (planned only once swapped in: the table
    sink checks its key at planning), then started from their rebuilt results once the upgrade is done."""
    spec_file, data = stream
    layout = layout_of(spec_file, data)
    edit(spec_file, lambda d: (window(d, window=FIFTEEN), [o["query"]["group_by"].append("event_date")
                                                           for o in d["outputs"] if o["name"] == TABLE]))
    assert run_upgrade(spark, spec_file, data, monkeypatch, "--step", "prepare", "--online") == upgrade.EXIT_OK
    assert upgrade.latest(layout)["online"] and upgrade.latest(layout)["phase"] == upgrade.PREPARED
    began = time.time()
    hot = Path(layout.checkpoint_root) / "hot"
    steps: dict[str, object] = {}

    def events(kind: str) -> list[dict]:
        return events_since(layout, kind, began)

    def operate() -> None:  # what the upgrade DAG does once the stream runs again
        try:
            wait(lambda: events("outputs_held"), "the driver holds the window output")
            commits = last_batch(hot, "commits")
            feed(spec_file, data, 3, 9)
            wait(lambda: last_batch(hot, "commits") != commits, "an unchanged output commits during the upgrade")
            steps["rebuild"] = step(spec_file, data, "--step", "rebuild")
            steps["hot during"] = last_batch(hot, "commits") != commits
            steps["swap"] = step(spec_file, data, "--step", "swap")
            wait(lambda: events("outputs_released"), "the window output started")
            checkpoint = layout_of(spec_file, data).checkpoint_root + f"/{WINDOW}"
            released = last_batch(checkpoint, "commits")
            feed(spec_file, data, 2, 10)
            wait(lambda: last_batch(checkpoint, "commits") != released, "the window output commits after its release")
            plan = compile_plan(load_spec(spec_file), layout)

            def read_all() -> bool:  # every landed file ingested, every accepted file read by the window output
                ingested = read_query_checkpoint(plan.checkpoint("_ingest")).processed_files
                return (not landing_backlog(plan.source.landing, ingested)[0]
                        and unread_accepted_files(plan, read_query_checkpoint(checkpoint)) == 0)

            wait(read_all, "the window output read every row the ingestion accepted")
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            steps["error"] = exc
        finally:
            layout.stop_marker.write_text('{"mode": "graceful"}')

    code = run_beside(spark, spec_file, data, monkeypatch, operate)
    assert "error" not in steps, steps.get("error")
    assert code == stream_job.EXIT_OK and steps == {"rebuild": 0, "hot during": True, "swap": 0}
    assert upgrade.latest(layout)["phase"] == upgrade.DONE
    assert verdicts(spec_file, data)[WINDOW].verdict == changes.UNCHANGED
    live = sink_rows(layout.data(f"sinks/sensors/{WINDOW}"))
    assert durations(live) == {timedelta(minutes=15)}
    assert window_rows(live) == expected_windows(spark, spec_file, data)
    assert upgrade.latest(layout)["rebuild"] == [WINDOW, TABLE] and verdicts(spec_file, data)[TABLE].verdict == (
        changes.UNCHANGED)
    with open_database(f"sqlite:///{layout.data_root / 'tables.db'}").connect() as conn:
        key = sorted((r[5], r[1]) for r in conn.execute('PRAGMA table_info("sensors_device_status")') if r[5])
    assert [name for _, name in key] == ["device_id", "event_date"]


def test_a_live_upgrade_holds_the_rebuilt_output_in_the_running_driver_and_starts_it_from_the_new_plan(
        spark, stream, monkeypatch) -> None:
    """The driver runs the spec as it was; the spec is edited and the upgrade prepared online: that driver
    stops the window output between batches and holds it while its other flows commit, and once the
    upgrade is done starts it from the upgraded spec's plan. One driver throughout: no stop, no restart."""
    spec_file, data = stream
    layout = layout_of(spec_file, data)
    began = time.time()
    hot, checkpoint = Path(layout.checkpoint_root) / "hot", Path(layout.checkpoint_root) / WINDOW
    steps: dict[str, object] = {}

    def events(kind: str) -> list[dict]:
        return events_since(layout, kind, began)

    def operate() -> None:  # what the upgrade DAG does while the stream runs
        try:
            wait(lambda: events("driver_started"), "the driver runs")
            edit(spec_file, lambda d: window(d, window=FIFTEEN))
            steps["prepare"] = step(spec_file, data, "--step", "prepare", "--online")  # until the driver holds it
            record = upgrade.latest(layout)
            steps["held"] = (record["phase"], record["live"], [e.get("live") for e in events("outputs_held")])
            commits = last_batch(hot, "commits")
            feed(spec_file, data, 3, 9)
            wait(lambda: last_batch(hot, "commits") != commits, "an unchanged output commits during the upgrade")
            steps["rebuild"] = step(spec_file, data, "--step", "rebuild")
            steps["swap"] = step(spec_file, data, "--step", "swap")
            wait(lambda: events("outputs_released"), "the window output started")
            released = last_batch(checkpoint, "commits")
            feed(spec_file, data, 2, 10)
            wait(lambda: last_batch(checkpoint, "commits") != released, "the window output commits after its release")
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            steps["error"] = exc
        finally:
            layout.stop_marker.write_text('{"mode": "graceful"}')

    code = run_beside(spark, spec_file, data, monkeypatch, operate)
    assert "error" not in steps, steps.get("error")
    assert code == stream_job.EXIT_OK and steps == {"prepare": 0, "held": (upgrade.PREPARED, True, [True]),
                                                    "rebuild": 0, "swap": 0}
    assert len(events("driver_started")) == 1  # the same driver throughout
    assert upgrade.latest(layout)["phase"] == upgrade.DONE
    assert verdicts(spec_file, data)[WINDOW].verdict == changes.UNCHANGED
    live = sink_rows(layout.data(f"sinks/sensors/{WINDOW}"))
    assert durations(live) == {timedelta(minutes=15)}  # rebuilt, then run on by the upgraded plan
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_OK  # whatever was still unread
    assert window_rows(sink_rows(layout.data(f"sinks/sensors/{WINDOW}"))) == expected_windows(spark, spec_file, data)


def test_a_live_reprocess_holds_every_flow_in_the_running_driver_and_starts_them_on_the_new_tables(
        spark, stream, monkeypatch) -> None:
    """A reprocess prepared online while the driver runs: the driver holds its ingestion and every
    output (it waits, it does not end), the input is read again beside it, and once swapped in the
    same driver starts them all from the new tables and goes on with what landed meanwhile, at the
    size sizing by lag set (one file a micro-batch here), not the spec's own limit."""
    from spark_jobs.runtime import rate_limit
    from spark_jobs.stream_spec.models import INGEST_FLOW

    spec_file, data = stream
    layout = layout_of(spec_file, data)
    edit(spec_file, lambda d: d.setdefault("execution", {}).update(sizing={"min_per_trigger": 1}))
    rate_limit.write(layout, 1, "files", "the test, as a supervisor's sizing by lag")
    began = time.time()
    ingestion = Path(layout.checkpoint_root) / INGEST_FLOW
    landing = Path(compile_plan(load_spec(spec_file), layout).source.landing)
    steps: dict[str, object] = {}

    def operate() -> None:
        try:
            wait(lambda: events_since(layout, "driver_started", began), "the driver runs")
            edit(spec_file, lambda d: d["deduplicate"].update(key=["device_id", "ts"]))
            steps["prepare"] = step(spec_file, data, "--step", "prepare", "--online")
            steps["held"] = sorted(events_since(layout, "outputs_held", began)[0]["outputs"])
            held_at = sorted(processed_files(ingestion))
            feed(spec_file, data, 2, 12)  # lands while the ingestion is held: read again with the rest
            steps["rebuild"] = step(spec_file, data, "--step", "rebuild")
            before = {p.name for p in landing.iterdir()}
            feed(spec_file, data, 2, 13)  # lands after the replay was made: read by the released ingestion
            steps["landed"] = {p.name for p in landing.iterdir()} - before
            steps["read while held"] = sorted(processed_files(ingestion)) != held_at
            steps["swap"] = step(spec_file, data, "--step", "swap")
            wait(lambda: events_since(layout, "outputs_released", began), "every flow started")
            wait(lambda: {p.name for p in landing.iterdir()} <= {Path(p).name for p in processed_files(ingestion)},
                 "the files landed during the reprocess are ingested")
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            steps["error"] = exc
        finally:
            layout.stop_marker.write_text('{"mode": "graceful"}')

    code = run_beside(spark, spec_file, data, monkeypatch, operate)
    assert "error" not in steps, steps.get("error")
    landed = steps.pop("landed")
    assert code == stream_job.EXIT_OK and steps == {
        "prepare": 0, "held": sorted([INGEST_FLOW, WINDOW, TABLE, "hot"]), "rebuild": 0, "read while held": False,
        "swap": 0}
    per_batch = [{Path(f).name for f in processed_files(ingestion, through_batch=b)
                  - processed_files(ingestion, through_batch=b - 1)} for b in range(last_batch(ingestion, "commits") + 1)]
    assert len(landed) >= 2  # one file a batch, as sizing set it (the spec says 10)
    assert [len(files) for files in per_batch if files & landed] == [1] * len(landed)
    assert len(events_since(layout, "driver_started", began)) == 1  # the same driver throughout
    assert upgrade.latest(layout)["phase"] == upgrade.DONE
    assert verdicts(spec_file, data)[INGEST_FLOW].verdict == changes.UNCHANGED
    keys = [(r["device_id"], r["ts"]) for r in sink_rows(layout.data("sinks/sensors/readings"))]
    assert len(keys) == len(set(keys))
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_OK  # whatever was still unread
    assert window_rows(sink_rows(layout.data(f"sinks/sensors/{WINDOW}"))) == expected_windows(spark, spec_file, data)


# ---- one step at a time ------------------------------------------------------------------------


def holding_a_step(spec_file: Path, data: Path, seconds: float, ending: Path) -> subprocess.Popen:
    """Another process that runs a step of the stream's upgrade (holds its claim) for ``seconds``,
    then writes ``ending`` as its last act in the step."""
    code = ("import sys, time\nfrom spark_jobs import upgrade\nfrom spark_jobs.stream_spec.layout import Layout\n"
            "from spark_jobs.stream_spec.loading import load_spec\n"
            f"spec = load_spec({str(spec_file)!r})\nlayout = Layout(spec, {str(data)!r}, spec_dir={str(spec_file.parent)!r})\n"
            f"with upgrade.one_step(layout, spec.name):\n    print('held', flush=True)\n    time.sleep({seconds})\n"
            f"    open({str(ending)!r}, 'w').close()\n")
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_rollback_sets_an_added_table_output_aside_and_clean_drops_it(tmp_path: Path) -> None:
    """An output the upgrade added, writing a database table: its rollback renames the table
    ``<table>__rolled_back_<n>`` (the plan rolled back to has no such output; added again, it finds
    no table), its checkpoint goes aside; a second rollback changes nothing; ``clean`` drops it."""
    from types import SimpleNamespace

    from spark_jobs.plan import TableDataset

    url = f"sqlite:///{tmp_path / 'tables.db'}"
    db = open_database(url)
    with db.connect() as conn:
        db.run_ddl(conn, ["CREATE TABLE totals (k INTEGER PRIMARY KEY)", "INSERT INTO totals VALUES (1)"])
    checkpoint = tmp_path / "checkpoints" / "totals"
    (checkpoint / "commits").mkdir(parents=True)
    layout = SimpleNamespace(lease_dir=tmp_path / "_control")  # what the upgrades' records need of a layout
    folder = upgrade.upgrades_dir(layout) / "000003"
    folder.mkdir(parents=True)
    record = upgrade._save({"number": 3, "folder": str(folder), "phase": upgrade.ROLLED_BACK, "new": {
        "totals": {"checkpoint": str(checkpoint), "sink": {"kind": "table", "table": "totals"}}}})
    plan = SimpleNamespace(outputs=[SimpleNamespace(name="totals", sink=TableDataset(url=url, table="totals"))])
    upgrade._set_aside_new(plan, record)
    upgrade._set_aside_new(plan, record)  # (a rollback run again: nothing left to move)
    assert db.rows_in("totals") is None and db.rows_in("totals__rolled_back_3") == 1
    assert not checkpoint.exists() and (folder / "rolled_back" / "totals" / "checkpoint" / "commits").is_dir()
    removed = upgrade.clean(plan, layout, keep=0)
    assert "upgrade 3: totals's table set aside by its rollback, totals__rolled_back_3" in removed
    assert db.rows_in("totals__rolled_back_3") is None and not (folder / "rolled_back").exists()


def test_one_step_of_an_upgrade_runs_at_a_time_and_a_killed_steps_claim_is_taken_at_once(tmp_path: Path) -> None:
    spec_file = include_with(tmp_path / "include", example_spec("sensors")) / "sensors.yaml"
    data = tmp_path / "data"
    layout = layout_of(spec_file, data)

    ending = tmp_path / "ending"
    other = holding_a_step(spec_file, data, 600, ending)
    try:
        with pytest.raises(upgrade.UpgradeRefused, match=rf"another step of stream sensors's upgrade still runs "
                                                          rf"\(.*pid {other.pid}.*\).*refusing to run beside it"):
            with upgrade.one_step(layout, "sensors", wait_seconds=1):
                pass
    finally:
        other.kill()
        other.wait()
    started = time.monotonic()
    with upgrade.one_step(layout, "sensors", wait_seconds=60):  # its process is gone: no waiting for a ttl
        assert time.monotonic() - started < 10

    # a step that finds another one running waits for its end, then runs
    other = holding_a_step(spec_file, data, 3, ending)
    with upgrade.one_step(layout, "sensors", wait_seconds=60):
        assert ending.exists()
    other.wait()


def test_a_step_whose_task_is_gone_halts() -> None:
    from spark_jobs.runtime.lease import EXIT_LEASE_LOST, host_id, process_start

    task = subprocess.Popen(["sleep", "600"])  # the Airflow task that submitted the step
    env = {**os.environ, upgrade.TASK_ENV: f"{host_id()}:{task.pid}:{process_start(task.pid)}"}
    step = subprocess.Popen([sys.executable, "-c", "import time\nfrom spark_jobs import upgrade\n"
                             "upgrade.watch_task(every=0.1)\nprint('watching', flush=True)\ntime.sleep(600)\n"],
                            env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert step.stdout.readline().strip() == "watching"
        assert step.poll() is None  # its task lives: it runs on
        task.kill()
        task.wait()
        assert step.wait(timeout=30) == EXIT_LEASE_LOST
    finally:
        for process in (task, step):
            if process.poll() is None:
                process.kill()
                process.wait()
