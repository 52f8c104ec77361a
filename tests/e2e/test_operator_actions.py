"""An operator's actions under the real platform (Airflow's API server, scheduler with the
LocalExecutor, DAG processor and triggerer on loopback, on PostgreSQL metadata as in
production; one instance for the whole file):

1. a backfill through Airflow's own ``airflow backfill create``: the run's data interval is
   the range; every output holds exactly what the accepted rows of that range give, and its
   validate task validated them (the same range run again gives identical files:
   tests/spark_jobs/test_backfill.py);
2. supervision: an immediate stop from the stop DAG (the driver is killed, the supervisor
   ends and the stream stays stopped, without spending its restart budget); started again,
   it catches up (a SIGKILLed driver's restart is test_faults.py's); the quality DAG
   validates every closed window with Great Expectations; the scheduled restart stops and
   resumes it; a graceful stop ends it; every sink equals the ground truth, the outputs
   agree, and never two drivers ran at once;
3. a stream whose driver fails at every start spends its restart budget: the supervisor
   fails saying so and why, and exactly one alert e-mail arrives at the SMTP server that
   Airflow's SMTP connection points at.

While the supervised stream runs, Prometheus' scrape of the streams' metrics (the metrics
token, over HTTP) is parsed with prometheus-client's parser and agrees with the checkpoint.
"""

from __future__ import annotations

import email
import email.message
import email.policy
import html
import json
import os
import shutil
import signal
import socketserver
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import psutil
import pytest
from airflow_harness import (
    ROOT,
    Airflow,
    deploy,
    describe_processes,
    example_spec,
    include_with,
    no_stream_drivers,
    one_driver_at_a_time,
    stream_drivers,
    wait_for,
)

from runner.processes import wait_until
from runner.testdata import generate, verify
from spark_jobs import backfill
from spark_jobs.flows import queries as flows
from spark_jobs.plan import StreamPlan, compile_plan
from spark_jobs.runtime.checkpoint import last_batch
from spark_jobs.runtime.lease import (
    holder_alive,
    read_holder,
)
from spark_jobs.runtime.progress import read_events
from spark_jobs.runtime.run_queue import RunQueue
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import (
    INGEST_FLOW,
)
from streamops import SHARED_DRIVER_DAG
from streamops.health import Status, assess
from streamops.restarts import RestartBudget

pytestmark = pytest.mark.e2e

ALERT_TO = "oncall@example.com"
ALERT_FROM = "streams@example.com"
#: The backfilled day: the generator's virtual clock starts at 2026-01-01T00:00:00Z.
DAY = "2026-01-01"
RANGE = ("2026-01-01T00:00:00+00:00", "2026-01-02T00:00:00+00:00")
MISSING_REFERENCE = "reference/no_such_devices.csv"
#: the scrapers' token of the metrics endpoint (STREAMS_METRICS_TOKEN of the API server)
METRICS_TOKEN = "e2e-metrics-scraper-token"


# ---- a mail server on loopback -----------------------------------------------------------------


class MailCatcher:
    """The smallest SMTP server that Airflow's SMTP hook can send to (no TLS, no login): keeps
    every message it receives."""

    def __init__(self) -> None:
        self.messages: list[email.message.EmailMessage] = []
        catcher = self

        class Session(socketserver.StreamRequestHandler):
            def reply(self, line: str) -> None:
                self.wfile.write(line.encode() + b"\r\n")
                self.wfile.flush()

            def handle(self) -> None:
                self.reply("220 127.0.0.1 ESMTP test")
                while line := self.rfile.readline():
                    verb = line.decode(errors="replace").strip().split(" ", 1)[0].upper()
                    if verb in ("EHLO", "HELO"):
                        self.reply("250 127.0.0.1")
                    elif verb == "DATA":
                        self.reply("354 end data with <CR><LF>.<CR><LF>")
                        data = []
                        while (part := self.rfile.readline()) not in (b".\r\n", b".\n", b""):
                            data.append(part[1:] if part.startswith(b".") else part)  # dot-unstuffing
                        catcher.messages.append(email.message_from_bytes(b"".join(data), policy=email.policy.default))
                        self.reply("250 OK: queued")
                    elif verb == "QUIT":
                        self.reply("221 bye")
                        return
                    else:  # MAIL, RCPT, RSET, NOOP
                        self.reply("250 OK")

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Session)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def about(self, text: str) -> list[email.message.EmailMessage]:
        return [m for m in self.messages if text in str(m["Subject"])]


def body(message: email.message.EmailMessage) -> str:
    """The text of an HTML message's body."""
    return html.unescape(message.get_body(("html", "plain")).get_content())


# ---- one Airflow for the file ------------------------------------------------------------------


@dataclass
class Platform:
    airflow: Airflow
    spec_dir: Path
    data_root: Path
    mail: MailCatcher

    def spec_path(self, name: str) -> Path:
        return self.spec_dir / f"{name}.yaml"

    def stream(self, name: str) -> tuple[StreamPlan, Layout]:
        """The stream's plan as its spec file says it now, and its layout (control files)."""
        spec = load_spec(self.spec_path(name))
        layout = Layout(spec, self.data_root, self.spec_dir)
        return compile_plan(spec, layout), layout

    def feed(self, name: str, files: int, seed: int) -> None:
        assert generate.main(["--spec", str(self.spec_path(name)), "--data-root", str(self.data_root),
                              "--files", str(files), "--events-per-file", "40", "--seed", str(seed)]) == 0

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        """Trigger a run; its run id."""
        before = {r["run_id"] for r in self.airflow.runs(dag_id)}
        self.airflow.cli("dags", "trigger", dag_id, *(("--conf", json.dumps(conf)) if conf else ()))
        return wait_for(lambda: next((r["run_id"] for r in self.airflow.runs(dag_id) if r["run_id"] not in before),
                                     None), f"the new run of {dag_id}", timeout=60, every=1)

    def state(self, dag_id: str, run_id: str) -> str | None:
        return next((r["state"] for r in self.airflow.runs(dag_id) if r["run_id"] == run_id), None)

    def task_state(self, dag_id: str, task_id: str, run_id: str) -> str:
        result = self.airflow.cli("tasks", "state", dag_id, task_id, run_id, check=False)
        lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
        return lines[-1] if result.returncode == 0 and lines else ""

    def exact(self, spark, name: str) -> None:
        """Never two drivers of the stream at once, every sink equal to the ground truth of what was
        generated, every output equal to its query over the accepted rows."""
        plan, layout = self.stream(name)
        one_driver_at_a_time(layout)
        manifest = json.loads((self.data_root / "generated" / name / "manifest.json").read_text())
        report = verify.compare(spark, plan, manifest)
        assert report.ok, report.describe()
        agreement = verify.agreement(spark, plan)
        assert all(r.ok for r in agreement), "\n".join(r.describe() for r in agreement)

    def task_log(self, dag_id: str, task_id: str, run_id: str | None = None) -> str:
        runs = f"run_id={run_id}" if run_id else "run_id=*"
        return "\n".join(p.read_text(errors="replace") for p in sorted(
            (self.airflow.home / "logs").glob(f"dag_id={dag_id}/{runs}/task_id={task_id}/attempt=*.log")))


def sensors_named(name: str) -> dict:
    """The sensors stream (a 2-second trigger, two files per batch) under another name and paths."""
    spec = example_spec("sensors")
    spec.update(name=name, checkpoint=f"checkpoints/{name}", trigger={"processing_time": "2 seconds"})
    spec["source"].update(path=f"landing/{name}", archive_path=f"archive/{name}", max_files_per_trigger=2)
    spec["quarantine"]["path"] = f"quarantine/{name}"
    for output in spec["outputs"]:
        if "path" in output["sink"]:
            output["sink"]["path"] = output["sink"]["path"].replace("sensors", name)
        else:
            output["sink"]["table"] = f"{name}_device_status"
    return spec


#: the streams besides sensors: one whose every start fails, one switched between execution modes
OTHER_STREAMS = ("doomed", "quiet")


def operator_specs(include: Path) -> Path:
    """include/ with the sensors stream (a 2-second trigger, two files per batch), `doomed`: the
    sensors stream under another name and paths, whose reference data does not exist (every start
    fails) and whose restart budget is one failed run, and `quiet`: the same, which runs well."""
    sensors = example_spec("sensors")
    sensors["trigger"] = {"processing_time": "2 seconds"}
    sensors["source"]["max_files_per_trigger"] = 2
    sensors["supervision"]["upgrade_watch"] = "20 seconds"
    doomed = sensors_named("doomed")
    doomed["enrich"][0]["path"] = MISSING_REFERENCE
    doomed["supervision"] = {"stall_window": "3 minutes",
                             "restart": {"max_attempts": 1, "backoff_initial_seconds": 1, "backoff_max_seconds": 2}}
    spec_dir = include_with(include, sensors, doomed, sensors_named("quiet"))
    for name in OTHER_STREAMS:
        shutil.copy(include / "expectations" / "sensors.yaml", include / "expectations" / f"{name}.yaml")
    return spec_dir


def dags_folder(folder: Path) -> Path:
    """The project's DAG file of the sensors stream, and one for each other stream written as the README says."""
    folder.mkdir(parents=True)
    shutil.copy(ROOT / "dags" / "stream_sensors.py", folder / "stream_sensors.py")
    shutil.copy(ROOT / "dags" / "shared_driver.py", folder / "shared_driver.py")
    for name in OTHER_STREAMS:
        (folder / f"stream_{name}.py").write_text(
            f'"""Airflow DAGs of the `{name}` stream."""\n\nfrom streamops.dag_factory import stream_dags\n\n'
            f'globals().update(stream_dags("{name}"))\n')
    return folder


@pytest.fixture(scope="module")
def platform(tmp_path_factory, module_postgres_database) -> Iterator[Platform]:
    """Airflow's services on PostgreSQL metadata, as in production (the other end-to-end tests run
    on the embedded default, SQLite)."""
    root = tmp_path_factory.mktemp("operator-actions")
    spec_dir = operator_specs(root / "include")
    data_root = root / "data"
    mail = MailCatcher()
    smtp = {"conn_type": "smtp", "host": "127.0.0.1", "port": mail.port,
            "extra": {"from_email": ALERT_FROM, "disable_tls": True, "disable_ssl": True, "timeout": 10,
                      "retry_limit": 0}}
    metadata_url = module_postgres_database.replace("postgresql://", "postgresql+psycopg://", 1)
    airflow = Airflow(root / "airflow", data_root, metadata_url, extra_env={
        "STREAMS_SPEC_DIR": str(spec_dir), "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder(root / "dags")),
        "STREAMS_ALERT_EMAIL": ALERT_TO, "AIRFLOW_CONN_SMTP_DEFAULT": json.dumps(smtp),
        "STREAMS_METRICS_TOKEN": METRICS_TOKEN})
    # the services import this checkout's code (the plugins folder, and spark_jobs through PYTHONPATH)
    assert Path(airflow.env["AIRFLOW__CORE__PLUGINS_FOLDER"]) == ROOT / "plugins"
    mail.start()
    try:
        airflow.start()
        wait_for(airflow.healthy, "the Airflow API server", timeout=180, every=2)
        yield Platform(airflow, spec_dir, data_root, mail)
    finally:
        airflow.stop()
        for pid in stream_drivers():
            os.kill(pid, signal.SIGKILL)
        mail.stop()


@pytest.fixture(autouse=True)
def leaves_no_driver(platform: Platform) -> Iterator[None]:
    """A test that failed with a stream still running leaves its drivers to the next test: kill them
    (and say so), so that each test's failure is its own."""
    yield
    if left := stream_drivers():
        print("killing the drivers a test left:\n" + describe_processes(left))
        for pid in left:
            os.kill(pid, signal.SIGKILL)


def scrape_metrics(p: Platform) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """One scrape of ``/streams/metrics`` as Prometheus makes it (the metrics token), parsed with
    prometheus-client's parser: every sample by name and labels."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    url = f"{p.airflow.url}/streams/metrics"
    # this Airflow lets every request in as an admin, but a token that is neither its own nor the
    # scrapers' is refused all the same
    assert requests.get(url, headers={"Authorization": "Bearer not-the-token"}, timeout=30).status_code in (401, 403)
    started = time.monotonic()
    response = requests.get(url, headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=30)
    print(f"a scrape of the metrics took {time.monotonic() - started:.2f}s")
    assert response.status_code == 200, response.text[:2000]
    assert response.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


# ---- 1. backfill -------------------------------------------------------------------------------


def backfill_runs(p: Platform, dag_id: str) -> list[dict]:
    return [r for r in p.airflow.runs(dag_id) if r["run_id"].startswith("backfill__")]


def create_backfill(p: Platform, dag_id: str) -> None:
    """``airflow backfill create`` for the day, as an operator would."""
    p.airflow.cli("backfill", "create", "--dag-id", dag_id, "--from-date", DAY, "--to-date", DAY,
                  "--max-active-runs", "1")


def snapshot(spark, plan: StreamPlan, layout: Layout) -> dict[str, list[str]]:
    lo, hi = backfill.parse_range(*RANGE)
    return {o.name: sorted(json.dumps(r.asDict(), default=str, sort_keys=True) for r in
                           spark.read.parquet(str(backfill.output_dir(layout, o.name, lo, hi))).collect())
            for o in plan.outputs}


def test_a_backfill_through_airflow_recomputes_every_output_exactly(platform: Platform, spark) -> None:
    p, dag = platform, "stream_sensors_backfill"
    plan, layout = p.stream("sensors")
    p.feed("sensors", files=8, seed=21)
    flows.run_available_now(spark, plan)  # the accepted rows the backfill reads (no transform: the plan is resolved)

    wait_for(lambda: dag in p.airflow.dag_ids(), f"the DAG processor to parse {dag}", timeout=180, every=2)
    p.airflow.cli("dags", "unpause", dag)  # backfill runs only start on an unpaused DAG
    # unpaused, the @daily DAG also runs its latest complete day (catchup is off): that day has no
    # accepted rows, so that run fails; let it end first, so the two never share the 2 cores
    wait_until(lambda: any(r["state"] in ("success", "failed") for r in p.airflow.runs(dag)
                           if not r["run_id"].startswith("backfill__")), 240, every=3)

    create_backfill(p, dag)
    run = wait_for(lambda: (runs := backfill_runs(p, dag)) and runs[0]["state"] in ("success", "failed") and runs[0],
                   "the backfill run to end", timeout=600, every=3)
    assert run["state"] == "success", p.task_log(dag, "*", run["run_id"])[-8000:]
    assert len(backfill_runs(p, dag)) == 1 and run["logical_date"].startswith(DAY)

    # exactly the accepted events of the day: not malformed, not duplicates, not dropped as late
    first = snapshot(spark, plan, layout)
    ledger = [json.loads(line) for line in (p.data_root / "generated" / "sensors" / "ledger.jsonl").read_text().splitlines()]
    lo, hi = backfill.parse_range(*RANGE)
    in_range = sorted(r["event"]["event_id"] for r in ledger
                      if r["kind"] in ("ok", "late_within") and lo <= datetime.fromisoformat(r["event"]["ts"]) < hi)
    rows = {o: [json.loads(r) for r in first[o]] for o in first}
    assert len(in_range) > 250
    assert sorted(r["event_id"] for r in rows["readings"]) == in_range
    # a 10-minute window sliding by 5 holds each row twice; the device table counts each row once
    assert sum(r["readings"] for r in rows["site_temperature_10m"]) == 2 * len(in_range)
    assert sum(r["readings"] for r in rows["device_status"]) == len(in_range)
    target = backfill.output_dir(layout, "readings", lo, hi)
    assert [d.name for d in target.parent.iterdir()] == ["range=20260101T000000Z_20260102T000000Z"]
    # and the validate task validated what it wrote
    validated = json.loads((layout.quality_dir / "ledger.json").read_text())["backfills"]
    unit = f"backfill {target.name}"
    assert {o: (v[unit]["status"], v[unit]["rows"]) for o, v in validated.items()} == {
        o: ("passed", len(rows[o])) for o in rows}


# ---- 2. supervision: stops, a kill, validation, a scheduled restart -------------------------


def test_a_supervised_stream_stops_at_once_resumes_validates_and_restarts_on_schedule(
        platform: Platform, spark) -> None:
    p = platform
    plan, layout = p.stream("sensors")
    readings = plan.checkpoint(INGEST_FLOW)
    budget = RestartBudget(layout.runs_file, plan.supervision.restart)
    p.feed("sensors", files=24, seed=31)

    def committed() -> int:
        batch = last_batch(readings, "commits")
        return -1 if batch is None else batch

    before = committed()
    deploy(p.airflow, "sensors")
    run = wait_for(lambda: next((r["run_id"] for r in p.airflow.runs("stream_sensors")), None),
                   "the supervisor run", timeout=60, every=1)
    wait_for(lambda: committed() >= before + 3, "3 committed batches", timeout=300)
    wait_for(lambda: p.task_state("stream_sensors", "running", run) == "success", "the deploy to be confirmed",
             timeout=120, every=2)

    # 2a. stop at once: the driver is killed wherever it is, and the stream stays stopped
    stop = p.trigger("stream_sensors_stop", {"mode": "immediate"})
    wait_for(lambda: p.state("stream_sensors_stop", stop) in ("success", "failed"), "the stop DAG to end",
             timeout=180, every=2)
    assert p.state("stream_sensors_stop", stop) == "success", p.task_log("stream_sensors_stop", "stop")
    no_stream_drivers()
    wait_for(lambda: p.state("stream_sensors", run) in ("success", "failed"), "the supervisor run to end",
             timeout=120, every=2)
    assert p.state("stream_sensors", run) == "success", p.task_log("stream_sensors", "supervise", run)
    assert layout.hold_marker.exists() and not holder_alive(layout.lease_dir)
    assert not wait_until(stream_drivers, 15, every=0.5), "the stream was started again"
    assert "immediate" in p.task_log("stream_sensors_stop", "stop", stop)
    # the kill was asked for: it is no failed run, and the next start waits for no backoff
    last = budget.last_run()
    assert last is not None and last.requested and last.exit_code != 0, last
    assert budget.consecutive_failures() == 0 and budget.next_delay() == 0

    # 2b. more input arrives while it is stopped; started again, it takes all of it
    p.feed("sensors", files=6, seed=32)
    again = p.trigger("stream_sensors")
    wait_for(lambda: assess(plan, layout).status == Status.IDLE, "the stream to catch up", timeout=420, every=2)
    assert "(backoff after" not in p.task_log("stream_sensors", "supervise", again)

    # the metrics Prometheus scrapes say what the checkpoint and the run history say
    batch_before, restarts = committed(), budget.restarts_since(time.time() - 86400)
    samples = scrape_metrics(p)

    def sample(name: str, **labels: str) -> float | None:
        return samples.get((name, tuple(sorted({"stream": "sensors", **labels}.items()))))

    statuses = {dict(labels)["status"]: v for (name, labels), v in samples.items()
                if name == "streams_status" and dict(labels)["stream"] == "sensors"}
    # idle, or healthy for the moment a no-data batch (the watermark moving on) runs
    assert sum(statuses.values()) == 1 and statuses["idle"] + statuses["healthy"] == 1, statuses
    assert 0 <= batch_before <= sample("streams_last_committed_batch", flow="ingestion") <= committed()
    assert sample("streams_driver_running") == 1 and sample("streams_stopped_on_purpose") == 0
    assert restarts >= 1 and sample("streams_restarts_last_day") == restarts  # started again after the stop
    assert sample("streams_read_rows_last_hour", flow="ingestion") > 0
    assert sample("streams_backlog_files") == 0 and sample("streams_batch_duration_seconds", flow="ingestion") > 0
    assert any(name == "streams_status" and ("stream", "doomed") in labels for name, labels in samples)  # every one

    # 2c. unpaused, the quality DAG validates the closed units of the live sinks, run by their asset
    # events (the sinks' watchers start with the unpaused DAG); a second event may start a
    # second run while the first one validates: every run must succeed, and one came from assets
    p.airflow.cli("dags", "unpause", "stream_sensors_quality")
    wait_for(lambda: (states := [r["state"] for r in p.airflow.runs("stream_sensors_quality")])
             and all(s == "success" for s in states), "the quality DAG to succeed", timeout=300, every=3)
    assert any(r["run_type"] == "asset_triggered" for r in p.airflow.runs("stream_sensors_quality"))
    quality = json.loads((layout.quality_dir / "summary.json").read_text())
    assert quality["ok"], quality
    windows_validated = quality["outputs"]["site_temperature_10m"]["validated"]
    balances = {b["output"]: b["status"] for b in quality["accounting"]["balances"]}
    assert balances["device_status"] in ("balanced", "incomplete"), balances  # incomplete: an event lost in a kill

    # 2d. the scheduled restart: unpaused, its cron's latest interval runs at once: a graceful
    # stop, a resume from the checkpoint and a new driver, with the downtime logged
    before_restart = read_holder(layout.lease_dir)
    p.airflow.cli("dags", "unpause", "stream_sensors_restart")
    # (a cron tick passing meanwhile makes a second scheduled run: each must succeed)
    wait_for(lambda: (states := [r["state"] for r in p.airflow.runs("stream_sensors_restart")])
             and all(s == "success" for s in states), "the scheduled restart to succeed", timeout=300, every=3)
    after_restart = read_holder(layout.lease_dir)
    assert after_restart is not None and after_restart.pid != before_restart.pid
    restart_run = p.airflow.runs("stream_sensors_restart")[0]["run_id"]
    assert p.task_state("stream_sensors_restart", "downtime", restart_run) == "success"

    # 2e. then a graceful stop from the stop DAG, which waits for the driver to exit
    graceful = p.trigger("stream_sensors_stop", {"mode": "graceful"})
    wait_for(lambda: p.state("stream_sensors_stop", graceful) in ("success", "failed"), "the graceful stop",
             timeout=240, every=2)
    assert p.state("stream_sensors_stop", graceful) == "success", p.task_log("stream_sensors_stop", "stop", graceful)
    no_stream_drivers()
    wait_for(lambda: (states := [r["state"] for r in p.airflow.runs("stream_sensors")])
             and len(states) >= 3 and all(s == "success" for s in states),
             "every supervisor run to end", timeout=120, every=2)
    p.exact(spark, "sensors")
    # every window in the sink was validated, once (in append mode only closed windows reach it)
    windows = spark.read.parquet(layout.data("sinks/sensors/site_temperature_10m")).select("window_end").distinct()
    assert windows_validated == windows.count() > 0
    # stopped at once (asked); stopped for the scheduled restart; stopped on request (a SIGKILL's
    # restart, a failed run, is test_faults.py's)
    assert [(r.exit_code != 0, r.requested) for r in budget.runs()[-3:]] == [(True, True), (False, True), (False, True)]


# ---- 3. alert --------------------------------------------------------------------------------


def test_a_spent_restart_budget_fails_the_supervisor_and_sends_one_alert_email(platform: Platform) -> None:
    p = platform
    plan, layout = p.stream("doomed")
    assert plan.source is not None and plan.source.landing is not None
    Path(plan.source.landing).mkdir(parents=True, exist_ok=True)
    missing = layout.reference(MISSING_REFERENCE)
    assert not Path(missing).exists()

    deploy(p.airflow, "doomed")
    run = wait_for(lambda: next((r["run_id"] for r in p.airflow.runs("stream_doomed")), None),
                   "the supervisor run", timeout=60, every=1)
    wait_for(lambda: p.task_state("stream_doomed", "supervise", run) in ("success", "failed", "up_for_retry"),
             "the supervisor task to end", timeout=300, every=3)
    assert p.task_state("stream_doomed", "supervise", run) == "failed"  # not retried: the budget is spent
    budget_spent = "1 failed runs within 60 minutes, the restart budget (1) is spent; the stream stays stopped"
    log = p.task_log("stream_doomed", "supervise", run)
    assert budget_spent in log and missing in log, log[-5000:]
    history = RestartBudget(layout.runs_file, plan.supervision.restart).runs()
    assert [(r.exit_code, r.requested) for r in history] == [(1, False)]  # one start, then no more
    no_stream_drivers(0)

    # one e-mail, to the address configured, naming the DAG, the task and the failure
    wait_for(lambda: p.mail.about("stream_doomed"), "the alert e-mail", timeout=60)
    assert not wait_until(lambda: len(p.mail.about("stream_doomed")) > 1, 15, every=0.5), "more than one alert"
    (alert,) = p.mail.about("stream_doomed")
    assert alert["Subject"] == "[streams] stream_doomed.supervise failed"
    assert alert["To"] == ALERT_TO and alert["From"] == ALERT_FROM
    text = body(alert)
    assert budget_spent in text and missing in text and "exit code 1" in text, text


# ---- 4. upgrade -------------------------------------------------------------------------------


def test_a_window_edited_in_place_is_upgraded_through_its_dag_while_the_other_outputs_commit(platform: Platform,
                                                                                             spark) -> None:
    """The spec edited under the running stream, its window resized in place (the state's schema the
    same) and given one more aggregate, and a grouping key added to its update-mode table, which
    moves to a new table, and the watermark changed: the upgrade DAG checks; the running driver holds those two outputs (no
    stop) for its savepoint; they are rebuilt beside their sinks, swapped in (a folder exchanged,
    a table renamed in one transaction) and watched. A SIGKILL of the driver during the rebuild: the supervisor's next driver holds the
    window output from its start (or runs it, rebuilt, if the swap came first), and the upgrade
    completes. A reader polling the window sink never sees two window sizes; the other outputs
    commit during the rebuild; afterwards every output equals its query over the accepted rows, and
    never two drivers ran at once."""
    import pyarrow.parquet as pq
    import yaml

    from spark_jobs import upgrade
    from spark_jobs.runtime.checkpoint import sink_files

    p = platform
    plan, layout = p.stream("sensors")

    def feed(seed: int) -> None:  # 4 files of 40 events 15 s of event time apart: the watermark moves 40 minutes
        assert generate.main(["--spec", str(p.spec_path("sensors")), "--data-root", str(p.data_root), "--files", "4",
                              "--events-per-file", "40", "--seed", str(seed), "--event-interval-ms", "15000"]) == 0

    feed(41)
    wait_for(lambda: "stream_sensors_upgrade" in p.airflow.dag_ids(), "the DAG processor to parse the upgrade DAG",
             timeout=180, every=2)
    for dag in ("stream_sensors", "stream_sensors_stop", "stream_sensors_upgrade"):  # as deploy and the page do
        p.airflow.cli("dags", "unpause", dag)
    run = p.trigger("stream_sensors")
    wait_for(lambda: assess(plan, layout).status == Status.IDLE, "the stream to catch up", timeout=300, every=2)
    live = layout.data("sinks/sensors/site_temperature_10m")

    def sizes() -> tuple[set, int] | None:  # the window sizes and rows a reader of the sink sees now
        try:
            rows = [r for f in sink_files(live) for r in pq.read_table(f.removeprefix("file:")).to_pylist()]
        except FileNotFoundError:  # a read in flight at the exchange: read again
            return None
        return {r["window_end"] - r["window_start"] for r in rows}, len(rows)

    # windows closed, of the spec's size (the window output's batch may come a trigger after the stream is idle)
    wait_for(lambda: (now := sizes()) is not None and now[0] == {timedelta(minutes=10)},
             "the window output to emit the windows the watermark closed", timeout=60, every=1)
    data = yaml.safe_load(p.spec_path("sensors").read_text())
    (window,) = [o for o in data["outputs"] if o["name"] == "site_temperature_10m"]
    window["query"]["window"] = {"duration": "15 minutes", "slide": "5 minutes"}
    window["query"]["aggregates"].append({"name": "min_temperature", "fn": "min", "column": "temperature"})
    (table,) = [o for o in data["outputs"] if o["name"] == "device_status"]
    table["query"]["group_by"].append("event_date")
    table["sink"]["table"] = "sensors_device_status_by_day"  # and its sink moved to a new table
    data["event_time"]["watermark"] = "12 minutes"  # the watermark the window's state is kept by
    p.spec_path("sensors").write_text(yaml.safe_dump(data, sort_keys=False))
    seen: list[tuple[frozenset, int]] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            if (now := sizes()) is not None:
                seen.append((frozenset(now[0]), now[1]))
            time.sleep(0.05)

    reader = threading.Thread(target=poll, daemon=True)
    reader.start()
    upgrade_run = p.trigger("stream_sensors_upgrade")
    try:
        wait_for(lambda: p.task_state("stream_sensors_upgrade", "rebuild", upgrade_run) == "running",
                 "the rebuild to start", timeout=420, every=1)
    except AssertionError:
        states = {t: p.task_state("stream_sensors_upgrade", t, upgrade_run) for t in ("rehearse", "check",
                                                                                     "prepare")}
        raise AssertionError(f"the rebuild did not start: {states}; runs of stream_sensors: "
                             f"{p.airflow.runs('stream_sensors')}") from None
    ingested = last_batch(f"{layout.checkpoint_root}/{INGEST_FLOW}", "commits")
    feed(42)  # input during the rebuild: the unchanged flows take it meanwhile
    fed_at = time.time()
    killed = read_holder(layout.lease_dir)
    os.kill(killed.pid, signal.SIGKILL)  # the driver that holds the window output, during the rebuild
    wait_for(lambda: p.state("stream_sensors_upgrade", upgrade_run) in ("success", "failed"), "the upgrade to end",
             timeout=600, every=2)
    done.set()
    reader.join(10)
    assert p.state("stream_sensors_upgrade", upgrade_run) == "success", "\n".join(
        p.task_log("stream_sensors_upgrade", t, upgrade_run)[-3000:] for t in ("check", "prepare", "rebuild", "swap",
                                                                              "watch"))
    # the driver that runs now started from the upgraded spec (the killed one's successor): no restart
    assert p.task_state("stream_sensors_upgrade", "restart_stop", upgrade_run) == "skipped"
    record = upgrade.latest(layout)
    assert record["phase"] == upgrade.DONE and record["live"]
    assert record["rebuild"] == ["site_temperature_10m", "device_status"], record["verdicts"]
    events = [e for e in read_events(layout.events_file) if e.get("logged_at", 0) >= record["started_at"]]
    held = next(e["logged_at"] for e in events if e.get("event") == "outputs_held" and e.get("live"))
    # the running driver held the window output (no stop, no start) until it was killed; its successor
    # held it from its start and released it, or started after the swap and ran it rebuilt
    started = [e for e in events if e.get("event") == "driver_started"]
    assert len(started) == 1 and started[0]["logged_at"] > held and started[0].get("pid") != killed.pid, started
    released = next((e["logged_at"] for e in events if e.get("event") == "outputs_released"),
                    max(record["finished_at"], started[0]["logged_at"]))
    taken = {q: min(e["logged_at"] for e in events if e.get("event") == "progress" and e.get("query") == q
                    and e["logged_at"] > fed_at and e.get("input_rows")) - fed_at for q in (INGEST_FLOW,)}
    print(f"input landed during the rebuild (its driver SIGKILLed), committed by the ingestion (and the readings "
          f"output it writes) after: {taken}")
    # the unchanged flows committed while the rebuilt outputs were held (their freshness during the upgrade)
    during = [e for e in events if e.get("event") == "progress" and held < e["logged_at"] < released
              and e.get("input_rows")]
    assert {e["query"] for e in during} >= {INGEST_FLOW}, during
    assert last_batch(f"{layout.checkpoint_root}/{INGEST_FLOW}", "commits") > ingested
    # never a mix: every read saw one window size
    assert seen and all(len(s) == 1 for s, _ in seen), sorted(set(seen))[:10]
    assert len({s for s, _ in seen}) == 2  # the old size, then the new

    plan, layout = p.stream("sensors")
    wait_for(lambda: assess(plan, layout).status == Status.IDLE, "the stream to catch up", timeout=300, every=2)
    graceful = p.trigger("stream_sensors_stop", {"mode": "graceful"})
    wait_for(lambda: p.state("stream_sensors_stop", graceful) in ("success", "failed"), "the graceful stop",
             timeout=240, every=2)
    no_stream_drivers()
    wait_for(lambda: p.state("stream_sensors", run) in ("success", "failed"), "the supervisor run to end",
             timeout=120, every=2)
    agreement = verify.agreement(spark, plan)
    assert all(r.ok for r in agreement), "\n".join(r.describe() for r in agreement)
    one_driver_at_a_time(layout)


# ---- 5. execution modes ----------------------------------------------------------------------


def test_a_stream_switched_to_scheduled_runs_when_input_arrives_survives_a_kill_adapts_and_switches_back(
        platform: Platform, spark) -> None:
    """A continuous stream's spec switched to scheduled runs on its input, in the shared driver: its
    supervisor stops the driver between batches and ends; the shared_driver DAG, unpaused, keeps a
    shared driver serving; files landing start an available-now run through the input's asset
    watcher, which the shared driver takes. A SIGKILL of the shared driver during the run does not
    break it: the run goes on in a JVM of its own, and Airflow starts the shared driver again.
    Between runs no driver is held and the stream is idle. Made adaptive, a burst of input starts a
    run in the new shared driver that goes on as a continuous driver, which stops once its input went
    quiet. Switched back and deployed, it runs continuously again; the shared driver, its DAG run
    marked failed from Airflow, stops. Every sink equals the ground truth, the outputs agree, and
    never two drivers ran at once."""
    import yaml

    p = platform
    plan, layout = p.stream("quiet")
    continuous = p.spec_path("quiet").read_text()
    ingestion = plan.checkpoint(INGEST_FLOW)
    p.feed("quiet", files=4, seed=51)
    deploy(p.airflow, "quiet")
    first = wait_for(lambda: next((r["run_id"] for r in p.airflow.runs("stream_quiet")), None), "the supervisor run",
                     timeout=60, every=1)
    wait_for(lambda: holder_alive(layout.lease_dir) and assess(plan, layout).status == Status.IDLE,
             "the continuous stream to catch up", timeout=300, every=2)

    # switched to scheduled: the running driver stops between batches, and its supervisor ends
    data = yaml.safe_load(continuous)
    data["execution"] = {"mode": "scheduled", "on_input": True, "freshness": "3 minutes", "input_poll": "2 seconds",
                         "shared_driver": True}
    p.spec_path("quiet").write_text(yaml.safe_dump(data, sort_keys=False))
    scheduled, _ = p.stream("quiet")
    wait_for(lambda: SHARED_DRIVER_DAG in p.airflow.dag_ids(), "the DAG processor to parse the shared driver's DAG",
             timeout=120, every=2)
    p.airflow.cli("dags", "unpause", SHARED_DRIVER_DAG)  # @continuous: it runs at once, and again whenever a run ends
    queue = RunQueue(layout.shared_driver_queue)
    wait_for(lambda: p.state("stream_quiet", first) in ("success", "failed"), "the continuous run to end",
             timeout=180, every=2)
    assert p.state("stream_quiet", first) == "success", p.task_log("stream_quiet", "supervise", first)[-3000:]
    assert "switch to scheduled runs" in p.task_log("stream_quiet", "supervise", first)
    assert not holder_alive(layout.lease_dir)
    assert RestartBudget(layout.runs_file, plan.supervision.restart).consecutive_failures() == 0
    shared = wait_for(queue.serving, "the shared driver to serve", timeout=240, every=1)

    # files land: the input's watcher asks for a run, which the shared driver takes; the shared
    # driver is killed once the run committed a batch, and the run goes on in a JVM of its own
    p.feed("quiet", files=6, seed=52)
    run = wait_for(lambda: next((r["run_id"] for r in p.airflow.runs("stream_quiet")
                                 if r["run_type"] == "asset_triggered"), None),
                   "a run started by the waiting input", timeout=240, every=2)
    holder = wait_for(lambda: (h := read_holder(layout.lease_dir)) is not None and h.alive() and h,
                      "the scheduled run's driver", timeout=180, every=0.5)
    assert holder.pid == shared["pid"], (holder, shared)  # the run is the shared driver's
    wait_for(lambda: any(c.stat().st_mtime > holder.started_at for c in (Path(ingestion) / "commits").glob("[0-9]*")),
             "the scheduled run's first commit", timeout=180, every=0.2)
    os.kill(holder.pid, signal.SIGKILL)
    wait_for(lambda: p.state("stream_quiet", run) in ("success", "failed"), "the scheduled run to end", timeout=300,
             every=2)
    log = p.task_log("stream_quiet", "supervise", run)
    assert p.state("stream_quiet", run) == "success", log[-3000:]
    assert "asked of the shared driver" in log and "exit 137" in log, log[-3000:]
    assert "restarting stream quiet" in log or "supervising stream quiet (run 2" in log, log[-3000:]
    # Airflow started the shared driver again (its task failed: a retry)
    again_shared = wait_for(lambda: (d := queue.serving()) is not None and d["pid"] != shared["pid"] and d,
                            "the shared driver to serve again", timeout=240, every=1)
    assert not holder_alive(layout.lease_dir)
    between = assess(scheduled, layout)
    assert between.status == Status.IDLE and between.reason.startswith("scheduled:"), between.summary()
    runs = len(p.airflow.runs("stream_quiet"))
    if wait_until(lambda: len(p.airflow.runs("stream_quiet")) > runs, 12, every=2):
        newest = p.airflow.runs("stream_quiet")[0]
        raise AssertionError(f"a run started with nothing waiting: {p.airflow.runs('stream_quiet')}\n"
                             f"{p.task_log('stream_quiet', 'supervise', newest['run_id'])[-3000:]}\n"
                             f"{read_events(layout.events_file)[-30:]}")

    # adaptive: a burst's run goes on continuously, and stops once the input went quiet
    data["execution"] = {"mode": "adaptive", "on_input": True, "freshness": "3 minutes", "input_poll": "2 seconds",
                         "continuous_above": 0.5, "quiet_for": "20 seconds", "shared_driver": True}
    p.spec_path("quiet").write_text(yaml.safe_dump(data, sort_keys=False))
    # (its DAG runs on its input as before: the watcher and the run read the spec file itself)
    burst_at = time.time()
    p.feed("quiet", files=8, seed=54)
    adaptive_run = wait_for(lambda: next((r["run_id"] for r in p.airflow.runs("stream_quiet")
                                          if r["run_type"] == "asset_triggered" and r["run_id"] != run), None),
                            "a run started by the burst", timeout=240, every=2)

    def decisions() -> list[dict]:
        return [e for e in read_events(layout.events_file) if e.get("event") == "execution_decision"]

    went = wait_for(lambda: next((e for e in decisions() if e["mode"] == "continuous"), None),
                    "the run to go on continuously", timeout=240, every=1)
    print(f"burst to continuous: {went['logged_at'] - burst_at:.1f}s (rate {went['rate']} records/s)")
    wait_for(lambda: p.state("stream_quiet", adaptive_run) in ("success", "failed"), "the adaptive run to end",
             timeout=300, every=2)
    log = p.task_log("stream_quiet", "supervise", adaptive_run)
    assert p.state("stream_quiet", adaptive_run) == "success", log[-3000:]
    assert f"asked of the shared driver (pid {again_shared['pid']}" in log, log[-3000:]
    back = decisions()[-1]
    assert back["mode"] == "scheduled" and back["rate"] < 0.25 and "its input went quiet" in log, (decisions(), log[-2000:])
    assert went["logged_at"] - burst_at < 180  # within its freshness
    assert not holder_alive(layout.lease_dir)

    # switched back and deployed: continuous again
    p.spec_path("quiet").write_text(continuous)
    p.feed("quiet", files=2, seed=53)
    wait_for(lambda: p.airflow.client.get("dags/stream_quiet").get("timetable_summary") in (None, "None"),
             "the DAG processor to parse the continuous DAG", timeout=120, every=3)
    again = p.trigger("stream_quiet")
    wait_for(lambda: holder_alive(layout.lease_dir) and assess(plan, layout).status == Status.IDLE,
             "the continuous stream to catch up", timeout=300, every=2)
    graceful = p.trigger("stream_quiet_stop", {"mode": "graceful"})
    wait_for(lambda: p.state("stream_quiet", again) in ("success", "failed"), "the supervisor run to end",
             timeout=240, every=2)
    assert p.state("stream_quiet_stop", graceful) == "success"
    p.exact(spark, "quiet")

    # the shared driver stopped from Airflow: its DAG paused, its run marked failed
    (serving,) = p.airflow.stop_dag(SHARED_DRIVER_DAG)
    wait_for(lambda: not queue.driver_file.exists() and not psutil.pid_exists(again_shared["pid"]),
             "the shared driver to stop", timeout=120, every=1)
    assert "stopping the shared driver" in p.task_log(SHARED_DRIVER_DAG, "serve", serving), \
        p.task_log(SHARED_DRIVER_DAG, "serve", serving)[-3000:]
