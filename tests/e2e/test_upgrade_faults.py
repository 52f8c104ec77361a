"""Faults during an upgrade under the real platform (a soak: its own command, docs/testing.md).

The sensors stream runs under Airflow (deployed through its DAG); its window is edited in
place, and its upgrade DAG is run three times:

1. the Airflow task of the ``rebuild`` step is SIGKILLed while its ``spark-submit`` rebuilds:
   that step sees its task gone and halts (it would run on beside the rollback otherwise), the
   DAG rolls the upgrade back (its rollback step waits for the step's end), and the stream
   runs its old plan again;
2. the spec is edited again (the window's aggregates; a SQL output added, which is computed
   over every accepted row since the stream began; the update-mode table retired; a reader
   option of the ingestion, a compatible change) and upgraded: after the swap the running driver,
   which started from the spec before, is restarted between batches (a start carries out the
   new, retired and compatible flows), and it is SIGKILLed during that stop: the next driver
   runs the rebuilt and the new outputs with the new option, and the upgrade completes;
3. the window is edited once more and upgraded, and the Airflow task of the ``swap`` step is
   SIGKILLed right after its swap: the DAG rolls that swapped upgrade back (the old sink exchanged
   back) and the stream runs on the plan before.

A reader polling the window sink throughout never sees two window sizes at once; afterwards
every output equals its query over the accepted rows, no step of an upgrade is left running,
and never two drivers ran at once (the lease's history).

And a scheduled stream's upgrade, which stops the stream first, has that ``stop`` task SIGKILLed
while it waits for a run in flight: the DAG goes back all the same, the stream is not left
stopped on purpose, and the upgrade run again carries the change out.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

import psutil
import pyarrow.parquet as pq
import pytest
import yaml
from airflow_harness import (
    Airflow,
    deploy,
    example_spec,
    include_with,
    no_stream_drivers,
    one_driver_at_a_time,
    stream_drivers,
    wait_for,
)

from runner.testdata import generate, verify
from spark_jobs import changes, upgrade
from spark_jobs.plan import compile_plan
from spark_jobs.runtime.checkpoint import sink_files
from spark_jobs.runtime.lease import read_holder
from spark_jobs.runtime.progress import read_events
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec
from streamops.health import Status, assess
from streamops.hooks.stream import StreamHook

pytestmark = [pytest.mark.e2e, pytest.mark.soak]

WINDOW = "site_temperature_10m"
#: an output added by an upgrade: computed over every accepted row since the stream began
HOT_READINGS = {"name": "hot_readings", "mode": "append",
                "query": {"type": "sql", "sql": "SELECT device_id, site, ts, temperature FROM accepted "
                                               "WHERE temperature > 25"},
                "sink": {"type": "parquet", "path": "sinks/sensors/hot_readings"}}


class Stream:
    def __init__(self, spec_dir: Path, data_root: Path):
        self.spec_path, self.data_root = spec_dir / "sensors.yaml", data_root
        self.seed = 70

    @property
    def layout(self) -> Layout:
        return Layout(load_spec(self.spec_path), self.data_root, self.spec_path.parent)

    def feed(self, files: int) -> None:  # 15 s of event time between events: the watermark moves on
        self.seed += 1
        assert generate.main(["--spec", str(self.spec_path), "--data-root", str(self.data_root), "--files", str(files),
                              "--events-per-file", "40", "--seed", str(self.seed), "--event-interval-ms", "15000"]) == 0

    def idle(self) -> bool:
        layout = self.layout
        return assess(compile_plan(load_spec(self.spec_path), layout), layout).status == Status.IDLE

    def edit_spec(self, change) -> None:
        """``change`` the spec (its data, as loaded from YAML)."""
        data = yaml.safe_load(self.spec_path.read_text())
        change(data)
        self.spec_path.write_text(yaml.safe_dump(data, sort_keys=False))

    def edit(self, change) -> None:
        """``change`` the window output's query."""
        self.edit_spec(lambda data: change(next(o for o in data["outputs"] if o["name"] == WINDOW)["query"]))

    def swap_outputs(self, retired: str, added: dict) -> None:
        """Retire an output and add another, with the retired one's quality rules gone (a rule of an
        output the spec does not have is an error in the spec)."""
        rules_path = self.spec_path.parent.parent / "expectations" / "sensors.yaml"
        rules = yaml.safe_load(rules_path.read_text())
        del rules["outputs"][retired]
        data = yaml.safe_load(self.spec_path.read_text())
        data["outputs"] = [o for o in data["outputs"] if o["name"] != retired] + [added]
        rules_path.write_text(yaml.safe_dump(rules, sort_keys=False))
        self.spec_path.write_text(yaml.safe_dump(data, sort_keys=False))


def step_processes(step: str) -> list[psutil.Process]:
    """The Python processes of an upgrade step (``spark_jobs/upgrade.py --step <step>``)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        argv = process.info["cmdline"] or []
        if len(argv) > 1 and argv[1].endswith("upgrade.py") and f"--step={step}" in "=".join(argv):
            found.append(process)
    return found


def kill_task_of(step: psutil.Process) -> float:
    """SIGKILL the Airflow task whose upgrade step ``step`` is; when."""
    task = step.parent().parent()  # the step's Python <- its spark-submit <- the Airflow task
    assert "airflow" in " ".join(task.cmdline()), task.cmdline()
    task.kill()
    return time.time()


def rolled_back_run(airflow: Airflow, dag_id: str, run_id: str, killed: str) -> None:
    """Wait for the upgrade's run to end: the ``killed`` task failed, the way back succeeded."""
    wait_for(lambda: airflow.client.run(dag_id, run_id)["state"] in ("success", "failed"), "the upgrade's run to end",
             timeout=600, every=2)
    states = tasks(airflow, dag_id, run_id)
    assert states[killed] == "failed" and states["rollback"] == "success", states
    assert states["rollback_running"] == "success", states


def tasks(airflow: Airflow, dag_id: str, run_id: str) -> dict[str, str | None]:
    answer = airflow.client.get(f"dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances")
    return {t["task_id"]: t["state"] for t in answer["task_instances"]}


def test_an_upgrade_survives_a_killed_step_task_by_rolling_back_and_a_driver_killed_in_its_restart_s_stop(
        tmp_path: Path, spark) -> None:
    sensors = example_spec("sensors")
    sensors["trigger"] = {"processing_time": "2 seconds"}
    sensors["source"]["max_files_per_trigger"] = 2
    sensors["supervision"]["upgrade_watch"] = "20 seconds"
    spec_dir = include_with(tmp_path / "include", sensors)
    stream = Stream(spec_dir, tmp_path / "data")
    stream.feed(4)
    airflow = Airflow(tmp_path / "airflow", stream.data_root, extra_env={"STREAMS_SPEC_DIR": str(spec_dir)})
    live = stream.layout.data(f"sinks/sensors/{WINDOW}")
    seen: list[frozenset] = []
    done = threading.Event()

    def poll() -> None:  # the window sizes a reader of the sink sees
        while not done.is_set():
            try:
                rows = [r for f in sink_files(live) for r in pq.read_table(f.removeprefix("file:")).to_pylist()]
            except FileNotFoundError:  # a read in flight at the exchange: read again
                rows = []
            if rows:
                seen.append(frozenset(r["window_end"] - r["window_start"] for r in rows))
            time.sleep(0.05)

    upgrade_dag = "stream_sensors_upgrade"
    try:
        airflow.start()
        deploy(airflow, "sensors")
        wait_for(lambda: upgrade_dag in airflow.dag_ids(), "the upgrade DAG", timeout=180, every=2)
        airflow.unpause(upgrade_dag)
        wait_for(lambda: stream.idle() and any(sink_files(live)), "the stream to catch up", timeout=300, every=2)
        reader = threading.Thread(target=poll, daemon=True)
        reader.start()

        # 1. the rebuild's task SIGKILLed: its step halts, the DAG rolls back
        stream.edit(lambda q: q.update(window={"duration": "15 minutes", "slide": "5 minutes"}))
        run = airflow.trigger(upgrade_dag)
        (step,) = wait_for(lambda: step_processes("rebuild") or None, "the rebuild step's spark-submit",
                           timeout=420, every=0.5)
        killed_at = kill_task_of(step)
        psutil.wait_procs([step], timeout=60)
        assert not step.is_running(), "the rebuild's step runs on after its task was killed"
        print(f"the rebuild's step halted {time.time() - killed_at:.1f}s after its task was killed")
        rolled_back_run(airflow, upgrade_dag, run, "rebuild")
        record = upgrade.latest(stream.layout)
        assert record["phase"] == upgrade.ROLLED_BACK, record
        stream.feed(4)
        wait_for(stream.idle, "the stream to take new input on its old plan", timeout=300, every=2)
        assert seen and all(s == {timedelta(minutes=10)} for s in seen), sorted(set(seen))[:5]

        # 2. edited again (one more aggregate; a SQL output added, the table retired, a reader option) and
        # upgraded; the driver, which runs the spec before, restarted after the swap, and SIGKILLed in that stop
        stream.edit(lambda q: q["aggregates"].append({"name": "min_temperature", "fn": "min",
                                                       "column": "temperature"}))
        stream.swap_outputs("device_status", HOT_READINGS)
        stream.edit_spec(lambda d: d["source"].update(options={"maxFileAge": "30d"}))  # a reader option
        before = read_holder(stream.layout.lease_dir)
        run = airflow.trigger(upgrade_dag)

        def asked_to_stop() -> bool:  # the restart's stop asks that driver (the marker it polls)
            try:
                return json.loads(stream.layout.stop_marker.read_text()).get("epoch") == before.epoch
            except (OSError, ValueError):
                return False

        wait_for(asked_to_stop, "the restart after the swap to ask the driver to stop", timeout=600, every=0.05)
        killed = read_holder(stream.layout.lease_dir)
        assert killed.epoch == before.epoch and killed.pid in stream_drivers(), (before, killed)
        os.kill(killed.pid, signal.SIGKILL)
        print(f"the driver of epoch {killed.epoch} SIGKILLed during its restart's stop")
        wait_for(lambda: airflow.client.run(upgrade_dag, run)["state"] in ("success", "failed"), "the upgrade's run to end",
                 timeout=600, every=2)
        states = tasks(airflow, upgrade_dag, run)
        assert airflow.client.run(upgrade_dag, run)["state"] == "success", states
        assert {t: states[t] for t in ("carry_out", "restart_stop", "restart_running", "watch")} == dict.fromkeys(
            ("carry_out", "restart_stop", "restart_running", "watch"), "success"), states
        record = upgrade.latest(stream.layout)
        assert record["phase"] == upgrade.DONE
        verdicts = {v["flow"]: v["verdict"] for v in record["verdicts"]}
        assert verdicts == {"_ingest": "compatible", "readings": "unchanged", WINDOW: "rebuild", "hot_readings": "new",
                            "device_status": "retired"}, record["verdicts"]
        assert [p["spec_sha256"] for p in changes.plans(stream.layout)][0] == changes.spec_hash(
            record["spec"])  # the driver that runs now started from the upgraded spec
        holder = read_holder(stream.layout.lease_dir)
        assert holder is not None and holder.pid != killed.pid
        stream.feed(4)
        wait_for(stream.idle, "the stream to take new input on its new plan", timeout=300, every=2)
        assert all(len(s) == 1 for s in seen), sorted(set(seen))[:5]  # never a mix
        assert {s for s in seen} == {frozenset({timedelta(minutes=10)}), frozenset({timedelta(minutes=15)})}
        assert not step_processes("rebuild") and not step_processes("swap")

        # 3. the window edited again and upgraded; the swap's task SIGKILLed right after its swap (the
        # record done): the DAG rolls that swapped upgrade back, the old sink exchanged back
        stream.edit(lambda q: q.update(window={"duration": "20 minutes", "slide": "5 minutes"}))
        earlier = record["number"]
        run = airflow.trigger(upgrade_dag)

        def swapped() -> list[psutil.Process] | None:
            latest = upgrade.latest(stream.layout)
            done_ = latest["number"] > earlier and latest["phase"] in (upgrade.SWAPPED, upgrade.DONE)
            return (step_processes("swap") or None) if done_ else None

        (step,) = wait_for(swapped, "the swap step to have swapped", timeout=600, every=0.02)
        kill_task_of(step)
        print(f"the swap's task SIGKILLed in phase {upgrade.latest(stream.layout)['phase']}")
        rolled_back_run(airflow, upgrade_dag, run, "swap")
        record = upgrade.latest(stream.layout)
        assert record["number"] > earlier and record["phase"] == upgrade.ROLLED_BACK, record
        pinned = upgrade.pinned_spec(stream.layout, stream.spec_path)
        assert pinned is not None
        stream.spec_path.write_text(pinned.read_text())  # the operator restores the spec it runs (the pin goes)
        stream.feed(4)
        wait_for(stream.idle, "the stream to take new input on the plan rolled back to", timeout=300, every=2)
        done.set()
        reader.join(10)
        assert all(len(s) == 1 for s in seen), sorted(set(seen))[:5]  # never a mix
        assert {timedelta(minutes=20)} in seen, "the swapped result was never live"
        assert seen[-1] == {timedelta(minutes=15)}  # rolled back
        assert not step_processes("swap")

        graceful = airflow.trigger("stream_sensors_stop", {"mode": "graceful"})
        wait_for(lambda: airflow.client.run("stream_sensors_stop", graceful)["state"] in ("success", "failed"),
                 "the graceful stop", timeout=240, every=2)
        no_stream_drivers()
    finally:
        done.set()
        airflow.stop()
        for pid in stream_drivers():
            os.kill(pid, signal.SIGKILL)
    layout = stream.layout
    agreement = verify.agreement(spark, compile_plan(load_spec(stream.spec_path), layout))
    assert all(r.ok for r in agreement), "\n".join(r.describe() for r in agreement)
    one_driver_at_a_time(layout)


def task_processes(airflow: Airflow, dag_id: str, run_id: str, task_id: str) -> list[psutil.Process]:
    """The processes of one task instance (its id is in their command lines), the executor's slot aside."""
    answer = airflow.client.get(f"dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances")
    (ti,) = [t for t in answer["task_instances"] if t["task_id"] == task_id]
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if ti["id"] in line and "LocalExecutor" not in line:
            found.append(process)
    return found


def test_a_scheduled_stream_s_upgrade_whose_stop_task_is_killed_goes_back_and_leaves_the_stream_free(
        tmp_path: Path) -> None:
    """A scheduled stream's upgrade stops it first; that ``stop`` task is SIGKILLed while it waits for a
    run in flight (after its hold): the DAG goes back all the same (the hold names the run), so the
    stream is not left stopped on purpose; its next run refuses the still edited spec (``blocked``),
    and the upgrade run again carries it out."""
    sensors = example_spec("sensors")
    sensors["source"]["max_files_per_trigger"] = 1  # a run takes one file a batch: it is in flight a while
    sensors["execution"] = {"mode": "scheduled", "on_input": True, "freshness": "15 minutes"}
    sensors["supervision"]["upgrade_watch"] = "20 seconds"
    spec_dir = include_with(tmp_path / "include", sensors)
    stream = Stream(spec_dir, tmp_path / "data")
    stream.feed(2)
    airflow = Airflow(tmp_path / "airflow", stream.data_root, extra_env={"STREAMS_SPEC_DIR": str(spec_dir)})
    upgrade_dag = "stream_sensors_upgrade"
    hook = StreamHook("sensors", str(spec_dir), str(stream.data_root))

    def ended(run: str) -> bool:
        return airflow.client.run(upgrade_dag, run)["state"] in ("success", "failed")

    try:
        airflow.start()
        deploy(airflow, "sensors")
        wait_for(lambda: upgrade_dag in airflow.dag_ids(), "the upgrade DAG", timeout=180, every=2)
        airflow.unpause(upgrade_dag)
        wait_for(lambda: stream.idle() and not stream_drivers(), "the first scheduled run", timeout=300, every=2)
        stream.feed(10)  # the next run, on this input: in flight when the upgrade's stop comes
        wait_for(lambda: hook.driver_alive(), "a scheduled run's driver", timeout=300, every=0.2)
        stream.edit(lambda q: q.update(window={"duration": "15 minutes", "slide": "5 minutes"}))
        run = airflow.trigger(upgrade_dag)
        wait_for(lambda: (hook.held_by() or "").startswith(f"{upgrade_dag} run {run} "), "the upgrade's stop to hold "
                 "the stream", timeout=300, every=0.05)
        assert hook.driver_alive(), "the run ended before the stop could be killed while it waits"
        killed = task_processes(airflow, upgrade_dag, run, "stop")
        assert killed, "no process of the stop task"
        for process in killed:
            process.kill()
        killed_at = time.time()
        wait_for(lambda: ended(run), "the upgrade's run to end", timeout=600, every=2)
        states = tasks(airflow, upgrade_dag, run)
        assert states["stop"] == "failed" and states["prepare"] == "upstream_failed", states
        assert states["changed"] == "success" and states["rollback"] == "success", states  # nothing to roll back
        assert states["rollback_resume"] == "success" and states["rollback_start"] == "success", states
        assert states["rollback_running"] == "failed", states  # the run it started refused the edited spec, at once
        assert hook.held_by() is None  # not left stopped on purpose
        refused = [e for e in read_events(stream.layout.events_file) if e.get("event") == "driver_failed"
                   and e.get("logged_at", 0) > killed_at]
        assert refused and "spec changed: an upgrade is needed" in refused[-1]["error"], refused
        assert upgrade.latest(stream.layout) is None  # nothing was prepared

        again = airflow.trigger(upgrade_dag)  # the way forward
        wait_for(lambda: ended(again), "the upgrade's second run to end", timeout=900, every=2)
        assert airflow.client.run(upgrade_dag, again)["state"] == "success", tasks(airflow, upgrade_dag, again)
        assert upgrade.latest(stream.layout)["phase"] == upgrade.DONE
        wait_for(lambda: stream.idle() and not stream_drivers(), "the stream to take its input", timeout=300,
                 every=2)
    finally:
        airflow.stop()
        for pid in stream_drivers():
            os.kill(pid, signal.SIGKILL)
    one_driver_at_a_time(stream.layout)
