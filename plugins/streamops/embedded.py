"""The whole platform on one machine (the embedded default): ``./platform up``.

Starts Airflow's own services on loopback (API server with login, scheduler with the
LocalExecutor, DAG processor, triggerer) on a SQLite metadata database, deploys every
stream through its DAGs (Spark local mode through the ``spark_streams`` connection),
feeds each stream from the generator, and lets the quality DAGs validate what the
streams write. It prints where to look and, every few seconds, each stream's status.

While it runs, the quality DAGs validate as units of the sinks close (Airflow assets).
Ctrl-C (or the end of ``--minutes``) shuts it down in order, saying every 15 seconds what
it waits for: the generators stop, the streams catch up with what landed, they stop
gracefully through their stop DAGs, the quality DAGs validate what they wrote, Airflow
stops; then a summary per stream (rows in, accepted, quarantined, duplicates, dropped
late, rows per sink against the generator's ground truth, restarts, units validated and
how soon after they closed, whether the accounting balances) is printed and written to
``<data root>/summary.json``. A second Ctrl-C skips the wait and kills. Spark's own output
(banners, progress bars) goes to the logs, not the terminal.

Everything lives under the data root (default ``data/platform``): landing directories,
checkpoints, sinks, quality reports and the Airflow home (``airflow/``, with its logs
and the generated login in ``airflow/passwords.json``). A second ``up`` on the same data
root continues where the first stopped; ``--fresh`` starts from nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from spark_jobs.quality.closing import validation_delays
from spark_jobs.quality.ledger import read_ledger
from spark_jobs.spec import Layout, StreamSpec, default_spec_dir, load_specs, project_root
from spark_jobs.tables import redact
from streamops import dag_id, tenure

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def wait_until(condition: Callable[[], Any], timeout: float, every: float = 1.0,
               interrupted: Callable[[], bool] = lambda: False) -> Any:
    """The condition's first true value, or None after ``timeout`` seconds (or when interrupted)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline or interrupted():
            return value
        time.sleep(every)


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 300, every: float = 0.5) -> Any:
    """The condition's first true value; an AssertionError naming ``what`` after ``timeout`` seconds."""
    value = wait_until(condition, timeout, every=every)
    if not value:
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
    return value


class AirflowServices:
    """Airflow's own services in one Airflow home, listening on loopback only.

    :param home: the Airflow home (metadata database, logs, generated passwords).
    :param data_root: ``STREAMS_DATA_DIR`` of the streams.
    :param metadata_url: SQLAlchemy URL of the metadata database (default SQLite in ``home``).
    :param spark_master: host of the ``spark_streams`` connection: where the streams run.
    :param all_admins: no login, every request is an admin (tests only); else ``users``
        (``name:role,...``) log in with the passwords Airflow generates into ``passwords_file``.
    :param extra_env: more environment variables for every service and command; they win over
        the defaults set here (e.g. ``AIRFLOW__CORE__DAGS_FOLDER``).
    """

    SERVICES = (["api-server"], ["scheduler", "--skip-serve-logs"], ["dag-processor"], ["triggerer", "--skip-serve-logs"])

    def __init__(self, home: Path, data_root: Path, *, port: int | None = None, metadata_url: str | None = None,
                 spark_master: str = "local[2]", all_admins: bool = False, users: str = "admin:admin",
                 passwords_file: Path | None = None, extra_env: dict[str, str] | None = None):
        self.home = Path(home)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.passwords_file = Path(passwords_file or self.home / "passwords.json")
        self.env = dict(
            os.environ,
            AIRFLOW_HOME=str(self.home), AIRFLOW__CORE__DAGS_FOLDER=str(project_root() / "dags"),
            AIRFLOW__CORE__PLUGINS_FOLDER=str(project_root() / "plugins"), AIRFLOW__CORE__EXECUTOR="LocalExecutor",
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=metadata_url or f"sqlite:///{self.home}/airflow.db",
            # psycopg 3 serves SQLAlchemy's async engine too (Airflow would pick asyncpg otherwise)
            **({"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": metadata_url} if metadata_url else {}),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__UNIT_TEST_MODE="False", AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=str(all_admins),
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=users,
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(self.passwords_file),
            AIRFLOW__API__HOST="127.0.0.1", AIRFLOW__API__PORT=str(self.port),
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{self.port}/execution/",
            AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
            AIRFLOW_CONN_SPARK_STREAMS=json.dumps({"conn_type": "spark", "host": spark_master}),
            STREAMS_DATA_DIR=str(data_root), PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", TZ="UTC",
            PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        )
        self.env.update(extra_env or {})  # added, or in place of the defaults above (e.g. the DAGs folder)
        self.procs: list[subprocess.Popen] = []
        self.all_admins, self.users = all_admins, users
        self._token: str | None = None

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        # a session of its own: a Ctrl-C at the terminal is for the platform, not for this command
        result = subprocess.run([str(BIN / "airflow"), *args], env=self.env, capture_output=True, text=True,
                                start_new_session=True, umask=PRIVATE)
        if check and result.returncode != 0:
            raise RuntimeError(f"airflow {' '.join(args)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
        return result

    def start(self) -> None:
        """Start the services. What they write (the metadata database, the generated passwords,
        the logs, which print those passwords) is for this user alone: the home is 0700 and
        they run with umask 077, as does what they start (the streams' drivers)."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.home.chmod(0o700)
        for written_before in (self.passwords_file, *self.home.glob("*.log"), *self.home.glob("airflow.db*")):
            if written_before.exists():  # by an earlier run, perhaps with a looser umask
                written_before.chmod(0o600)
        self.cli("db", "migrate")
        for service in self.SERVICES:
            log = private_log(self.home / f"{service[0]}.log")
            self.procs.append(subprocess.Popen([str(BIN / "airflow"), *service], env=self.env, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True, umask=PRIVATE))

    def stop(self, timeout: float = 30) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def dead_services(self) -> list[str]:
        return [" ".join(service) for service, p in zip(self.SERVICES, self.procs, strict=False) if p.poll() is not None]

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    # -- Airflow's REST API (a CLI command costs seconds of CPU; the API answers in milliseconds)

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A call of Airflow's REST API (``/api/v2/...``) as the first configured user (admin)."""
        for attempt in (1, 2):
            if self._token is None:
                self._token = self._new_token()
            request = urllib.request.Request(
                f"{self.url}{path}", method=method, data=None if body is None else json.dumps(body).encode(),
                headers={"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return json.loads(response.read() or b"null")
            except urllib.error.HTTPError as exc:
                if exc.code == 401 and attempt == 1:  # the token expired: a new one
                    self._token = None
                    continue
                raise RuntimeError(f"Airflow API {method} {path}: HTTP {exc.code} {exc.read()[:500]!r}") from None
        raise AssertionError("unreachable")

    def _new_token(self) -> str:
        if self.all_admins:
            request = urllib.request.Request(f"{self.url}/auth/token")
        else:
            user = self.users.split(",")[0].split(":")[0]
            password = json.loads(self.passwords_file.read_text(encoding="utf-8"))[user]
            request = urllib.request.Request(f"{self.url}/auth/token", method="POST",
                                             data=json.dumps({"username": user, "password": password}).encode(),
                                             headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())["access_token"]

    def dag_ids(self) -> set[str]:
        try:
            return {d["dag_id"] for d in self.api("GET", "/api/v2/dags?limit=100")["dags"]}
        except (OSError, RuntimeError, ValueError, KeyError):
            result = self.cli("dags", "list", "-o", "json", check=False)
            return {d["dag_id"] for d in json_lines(result.stdout)} if result.returncode == 0 else set()

    def runs(self, dag_id: str) -> list[dict]:
        """The DAG's runs, newest first: run_id, state, run_type, conf, ..."""
        try:
            runs = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns?order_by=-run_after&limit=100")["dag_runs"]
        except (OSError, RuntimeError, ValueError, KeyError):  # no API server (yet): the CLI reads the database
            return json_lines(self.cli("dags", "list-runs", dag_id, "-o", "json").stdout)
        return [{"run_id": r["dag_run_id"], **r} for r in runs]

    def unpause(self, dag_id: str) -> None:
        self.api("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        """Trigger a run of the DAG (as Airflow's own trigger form: now, with ``conf``); its run id."""
        run = self.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})
        return run["dag_run_id"]

    def import_errors(self) -> list[dict]:
        return json_lines(self.cli("dags", "list-import-errors", "-o", "json", check=False).stdout)


#: the umask of every process the platform starts: what they create is for this user alone
PRIVATE = 0o077


def private_log(path: Path):  # noqa: ANN201 - a file object, closed with the process that writes it
    """``path`` opened for appending, readable by this user alone (0600, also if it existed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "a")


@contextmanager
def output_to(path: Path) -> Iterator[None]:
    """Standard output and error of this process, and of what it starts meanwhile (a JVM, which
    keeps them), go to ``path`` instead of the terminal: no Spark banners or progress bars there."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    saved = os.dup(1), os.dup(2)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (*saved, fd):
            os.close(f)


def json_lines(stdout: str) -> list[dict]:
    """The JSON list an airflow CLI command printed (it may print log lines too)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("["):
            return json.loads(line)
    return []


# ---- the platform ----------------------------------------------------------------------------


class Platform:
    """Airflow, the streams' DAGs and the generators, started and stopped in order."""

    def __init__(self, specs: dict[str, StreamSpec], spec_dir: Path, data_root: Path, port: int,
                 rate: float, events_per_file: int, master: str, out: Callable[[str], None] = print):
        self.specs, self.spec_dir, self.data_root = specs, spec_dir, data_root
        self.rate, self.events_per_file = rate, events_per_file
        self.layouts = {name: Layout(spec, data_root, spec_dir) for name, spec in specs.items()}
        self.airflow = AirflowServices(data_root / "airflow", data_root, port=port, spark_master=master,
                                       extra_env={"STREAMS_SPEC_DIR": str(spec_dir)})
        self.generators: dict[str, subprocess.Popen] = {}
        self.quality_runs: dict[str, list[dict[str, Any]]] = {}
        self.started_at = time.time()
        self.deployed = False
        self.interrupts = 0
        self.out = out

    # -- start

    def start(self) -> None:
        self.out(f"==> Airflow: migrating the metadata database in {self.airflow.home}")
        self.airflow.start()
        self.out(f"==> Airflow: API server, scheduler (LocalExecutor), DAG processor and triggerer on {self.airflow.url}")
        if not wait_until(self.airflow.healthy, 180, interrupted=self.stopping):
            if self.stopping():
                return
            raise RuntimeError(f"the Airflow API server did not come up; see {self.airflow.home}/api-server.log")
        wanted = {dag_id(name, role) for name in self.specs for role in ("", "stop", "quality")}
        self.out("==> waiting for the DAG processor to parse the streams' DAGs")
        if not wait_until(lambda: wanted <= self.airflow.dag_ids(), 240, every=3, interrupted=self.stopping):
            if self.stopping():
                return
            errors = "\n".join(f"  {e.get('filename')}: {e.get('stack_trace', '')[-300:]}"
                               for e in self.airflow.import_errors())
            raise RuntimeError(f"DAGs not parsed: {sorted(wanted - self.airflow.dag_ids())}\n{errors}")
        deployed_at = time.time()
        for name in sorted(self.specs):
            for dag in (dag_id(name), dag_id(name, "stop"), dag_id(name, "quality")):
                self.airflow.unpause(dag)
            self.airflow.trigger(dag_id(name))
            self.deployed = True
            self.out(f"==> {name}: deployed through DAG stream_{name}; quality DAG stream_{name}_quality unpaused "
                     f"(it validates when units of the stream's sinks close: Airflow assets)")
            self.generators[name] = subprocess.Popen(
                [sys.executable, "-m", "spark_jobs.testdata.generate", "--spec", str(self.spec_dir / f"{name}.yaml"),
                 "--data-root", str(self.data_root), "--rate", str(self.rate),
                 "--events-per-file", str(self.events_per_file)],
                stdout=private_log(self.data_root / "logs" / f"generate-{name}.log"),
                stderr=subprocess.STDOUT, start_new_session=True, umask=PRIVATE)
        self.out("==> waiting for the streams' supervisor tasks to start")
        wait_until(lambda: all((t := tenure.current(layout.lease_dir)) is not None and t.started_at >= deployed_at
                               for layout in self.layouts.values()), 120, interrupted=self.stopping)
        self.print_where()

    def print_where(self) -> None:
        self.out("")
        self.out(f"  Airflow UI     {self.airflow.url}  (user admin, password in {self.airflow.passwords_file})")
        self.out(f"  Streams page   {self.airflow.url}/streams/")
        for name, layout in sorted(self.layouts.items()):
            spec = self.specs[name]
            sinks = ", ".join(_where(layout, o) for o in spec.outputs)
            self.out(f"  {name:<14} landing {layout.landing}; sinks {sinks}")
            self.out(f"  {'':<14} Data Docs {self.data_root / 'quality' / name / 'docs' / 'index.html'}")
        self.out(f"  logs           {self.airflow.home} (Airflow), {self.data_root / 'logs'} (generators)")
        self.out("  Ctrl-C stops everything gracefully\n")

    # -- run

    def stopping(self) -> bool:
        return self.interrupts > 0

    def watch(self, minutes: float | None, every: float = 15.0) -> None:
        from streamops.health import assess

        deadline = None if minutes is None else time.monotonic() + minutes * 60
        while not self.stopping() and (deadline is None or time.monotonic() < deadline):
            dead = self.airflow.dead_services()
            if dead:
                raise RuntimeError(f"Airflow service(s) ended: {dead}; see the logs in {self.airflow.home}")
            line = []
            for name, spec in sorted(self.specs.items()):
                h = assess(spec, self.layouts[name])
                batches = max((b for b in h.last_committed.values() if b is not None), default=None)
                line.append(f"{name}: {h.status}, batch {batches if batches is not None else '-'}, "
                            f"backlog {h.backlog_files} file(s)")
            self.out(f"[{time.strftime('%H:%M:%S')}] " + "; ".join(line))
            wait_until(lambda: False, every if deadline is None else min(every, max(0.0, deadline - time.monotonic())),
                       every=0.5, interrupted=self.stopping)

    # -- stop

    def shutdown(self, graceful: bool = True) -> None:
        """Stop everything; ``graceful``: let the streams take what landed, stop them through their
        stop DAGs, validate what they wrote, then stop Airflow. Says where it is every 15 s."""
        from streamops.hooks.stream import StreamHook

        began = time.monotonic()
        for gen in self.generators.values():
            if gen.poll() is None:
                gen.send_signal(signal.SIGTERM)
        for gen in self.generators.values():
            try:
                gen.wait(60)
            except subprocess.TimeoutExpired:
                gen.kill()
        graceful = graceful and self.deployed
        second_interrupt = lambda: self.interrupts > 1  # noqa: E731
        if graceful:
            self.out("==> generators stopped; waiting for the streams to take what landed")
            self.catch_up(second_interrupt)
        self.out("==> stopping the streams" + (" gracefully (stop DAGs)" if graceful else ""))
        if graceful and not second_interrupt():
            self.run_dags({dag_id(name, "stop"): {"mode": "graceful"} for name in sorted(self.specs)}, 240,
                          second_interrupt)
        for name in sorted(self.specs):
            hook = StreamHook(name, str(self.spec_dir), str(self.data_root))
            if hook.driver_alive():
                hook.kill_driver()
                hook.wait_for_exit(30)
        if graceful and not second_interrupt():
            # after the streams stopped: the validation has the machine to itself
            self.out("==> validating what the streams wrote (quality DAGs)")
            self.run_dags({dag_id(name, "quality"): {} for name in sorted(self.specs)}, 600, second_interrupt)
        if self.deployed:
            self.quality_runs = self._quality_runs()
        self.out("==> stopping Airflow")
        self.airflow.stop()
        self.out(f"==> shut down in {time.monotonic() - began:.0f} s")

    def _quality_runs(self) -> dict[str, list[dict[str, Any]]]:
        """The quality DAGs' runs (before Airflow stops): how validation was started, and how it went."""
        try:
            return {name: self.airflow.runs(dag_id(name, "quality")) for name in self.specs}
        except (OSError, RuntimeError) as exc:
            self.out(f"    could not list the quality DAGs' runs: {exc}")
            return {}

    def catch_up(self, interrupted: Callable[[], bool], timeout: float = 300) -> None:
        """Wait until every stream is idle (all input taken); give up on one that stays down for 60 s."""
        from streamops.health import Status, assess

        pending = set(self.specs)
        down_since: dict[str, float] = {}
        say = Every(PROGRESS_SECONDS)

        def settled() -> bool:
            healths = {name: assess(self.specs[name], self.layouts[name]) for name in sorted(pending)}
            for name, health in healths.items():
                if health.status == Status.IDLE:
                    pending.discard(name)
                    self.out(f"    {name}: took everything that landed ({_batches(health)})")
                elif health.status in (Status.DEAD, Status.CORRUPT):
                    down_since.setdefault(name, time.monotonic())
                    if time.monotonic() - down_since[name] > 60:
                        pending.discard(name)
                        self.out(f"    {name} is down; not waiting for it: {health.summary()}")
                else:
                    down_since.pop(name, None)
            if pending and say.due():
                self.out(f"    [{time.strftime('%H:%M:%S')}] waiting for the streams to take what landed: " + "; ".join(
                    f"{name}: {healths[name].status}, {healths[name].backlog_files} file(s) waiting, "
                    f"{_batches(healths[name])}" for name in sorted(pending)))
            return not pending

        wait_until(settled, timeout, interrupted=interrupted)
        for name in sorted(pending):
            self.out(f"    {name} has not caught up: {assess(self.specs[name], self.layouts[name]).summary()}")

    def run_dags(self, runs: dict[str, dict[str, Any]], timeout: float,
                 interrupted: Callable[[], bool]) -> dict[str, str]:
        """Trigger a run of each DAG (with its conf), all at once, and wait for every run to
        end; each DAG's final state ("unfinished" after ``timeout`` seconds)."""
        ids = {dag: self.airflow.trigger(dag, conf) for dag, conf in runs.items()}
        states: dict[str, str] = {}
        current: dict[str, str] = {}
        began = time.monotonic()
        say = Every(PROGRESS_SECONDS)

        def ended() -> bool:
            for dag, run_id in ids.items():
                if dag in states:
                    continue
                state = next((r["state"] for r in self.airflow.runs(dag) if r["run_id"] == run_id), "unknown")
                current[dag] = state
                if state in ("success", "failed"):
                    states[dag] = state
                    self.out(f"    {dag}: {state} after {time.monotonic() - began:.0f} s")
            waiting = [dag for dag in runs if dag not in states]
            if waiting and say.due():
                self.out(f"    [{time.strftime('%H:%M:%S')}] waiting for " + ", ".join(
                    f"{dag} ({current.get(dag, 'queued')}, {time.monotonic() - began:.0f} s)" for dag in waiting)
                    + self._doing(waiting))
            return not waiting

        wait_until(ended, timeout, every=1, interrupted=interrupted)
        for dag in runs:
            if dag not in states:
                states[dag] = "unfinished"
                self.out(f"    {dag}: unfinished")
        return states

    def _doing(self, dags: list[str]) -> str:
        """What the streams of the DAGs are doing meanwhile (a driver still finishing a batch)."""
        from streamops.health import assess

        alive = [name for name in sorted(self.specs) if any(d.startswith(dag_id(name)) for d in dags)
                 and assess(self.specs[name], self.layouts[name]).driver_pid is not None]
        return f"; driver still running: {', '.join(alive)}" if alive else ""

    # -- summary

    def summary(self) -> dict[str, Any]:
        """Per stream: the accounting measured by the quality DAG, every sink against the ground truth,
        restarts in this run and the units validated."""
        from spark_jobs.session import build_session
        from spark_jobs.testdata import verify
        from streamops.restarts import RestartBudget

        with output_to(self.data_root / "logs" / "summary-spark.log"):  # the JVM keeps writing there, not here
            spark = build_session("platform-summary", master="local[1]",
                                  extra={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        logging.getLogger("py4j").setLevel(logging.WARNING)
        result: dict[str, Any] = {"started_at": self.started_at, "ended_at": time.time(), "streams": {}}
        try:
            for name, spec in sorted(self.specs.items()):
                layout = self.layouts[name]
                manifest_path = self.data_root / "generated" / name / "manifest.json"
                manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else None
                report = verify.compare(spark, spec, layout, manifest) if manifest else None
                agreement = verify.agreement(spark, spec, layout) if spec.has_ingestion else []
                quality_path = layout.quality_dir / "summary.json"
                quality = json.loads(quality_path.read_text()) if quality_path.exists() else {}
                budget = RestartBudget(layout.runs_file, spec.supervision.restart)
                delays = sorted(validation_delays(spec, layout, read_ledger(layout.quality_dir), since=self.started_at))
                runs = self.quality_runs.get(name, [])
                result["streams"][name] = {
                    "expected": manifest["counts"] if manifest else None,
                    "sinks": [{"output": o.name, "rows": o.actual, "expected": o.expected, "equal": o.ok,
                               "detail": o.describe()} for o in (report.outputs if report else [])],
                    "quarantined": report.quarantined if report else None,
                    "ground_truth_equal": bool(report and report.ok),
                    "outputs_agree": all(r.ok for r in agreement),
                    "disagreements": [r.describe() for r in agreement if not r.ok],
                    "restarts": budget.restarts_since(self.started_at),
                    "validated": {o: {k: v[k] for k in ("validated", "passed", "failed")}
                                  for o, v in quality.get("outputs", {}).items()},
                    "accounting": quality.get("accounting"),
                    "quality_ok": quality.get("ok"),
                    "quality_runs": {kind: sum(r.get("run_type") == kind for r in runs)
                                     for kind in ("asset_triggered", "manual", "scheduled")},
                    "validation_delay_seconds": {
                        "units": len(delays), "median": statistics.median(delays) if delays else None,
                        "max": delays[-1] if delays else None},
                }
        finally:
            spark.stop()
        return result


#: how often the platform says where it is while it waits (catching up, stopping, validating)
PROGRESS_SECONDS = 15.0


class Every:
    """True once every ``seconds`` (first after ``seconds``)."""

    def __init__(self, seconds: float):
        self.seconds, self.last = seconds, time.monotonic()

    def due(self) -> bool:
        if time.monotonic() - self.last < self.seconds:
            return False
        self.last = time.monotonic()
        return True


def _batches(health: Any) -> str:
    committed = [b for b in health.last_committed.values() if b is not None]
    return f"batch {max(committed)} committed" if committed else "no batch committed"


def _where(layout: Layout, output: Any) -> str:
    sink = output.sink
    return layout.data(sink.path) if hasattr(sink, "path") else f"{sink.table} ({redact(layout.table_url(sink))})"


def describe_summary(summary: dict[str, Any]) -> list[str]:
    lines = []
    for name, s in summary["streams"].items():
        lines.append(f"{name}:")
        e = s["expected"]
        if e:
            lines.append(f"  generated: {e['input_records']} rows in = {e['accepted']} accepted + {e['quarantined']} "
                         f"quarantined + {e['duplicates']} duplicates + {e['dropped_late']} dropped late")
        acc = s["accounting"]
        for b in (acc or {}).get("balances", []):
            accepted = "?" if b["accepted"] is None else b["accepted"]
            lines.append(f"  measured {b['output']}: {b['input']} in = {accepted} accepted + {b['quarantined']} "
                         f"quarantined + {b['duplicates']} duplicates + {b['dropped_late']} dropped late: {b['status']}")
        for sink in s["sinks"]:
            lines.append(f"  sink {sink['detail']}")
        lines.append(f"  quarantine: {s['quarantined']} rows")
        validated = ", ".join(f"{o} {v['validated']} ({v['passed']} passed, {v['failed']} failed)"
                              for o, v in s["validated"].items()) or "nothing yet"
        lines.append(f"  restarts: {s['restarts']}; units validated: {validated}")
        runs, delay = s.get("quality_runs") or {}, s.get("validation_delay_seconds") or {}
        if runs:
            lines.append(f"  quality DAG runs: {runs.get('asset_triggered', 0)} on new output (asset events), "
                         f"{runs.get('manual', 0)} triggered, {runs.get('scheduled', 0)} on the clock")
        if delay.get("units"):
            lines.append(f"  from a unit closing to its validation: median {delay['median']:.0f} s, "
                         f"max {delay['max']:.0f} s ({delay['units']} unit(s))")
        for d in s.get("disagreements", []):
            lines.append(f"  DISAGREES with the accepted rows: {d}")
        lines.append(f"  every sink equals the ground truth: {'yes' if s['ground_truth_equal'] else 'NO'}; "
                     f"every output equals its query over the accepted rows: "
                     f"{'yes' if s.get('outputs_agree') else 'NO'}; "
                     f"data quality: {'passed' if s['quality_ok'] else 'FAILED or not run'}")
    return lines


def up(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="./platform up", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, help="run this long, then shut down and print the summary "
                                                 "(default: until Ctrl-C)")
    p.add_argument("--port", type=int, default=8080, help="the Airflow UI's port on 127.0.0.1 (default 8080)")
    p.add_argument("--data-root", type=Path, default=project_root() / "data" / "platform")
    p.add_argument("--spec-dir", type=Path, default=default_spec_dir())
    p.add_argument("--rate", type=float, default=0.5, help="files per second per stream from the generator")
    p.add_argument("--events-per-file", type=int, default=40)
    p.add_argument("--master", default="local[2]", help="the spark_streams connection's host (default local[2])")
    p.add_argument("--fresh", action="store_true", help="delete the data root first")
    args = p.parse_args(argv)
    if args.minutes is not None and args.minutes <= 0:
        p.error("--minutes must be positive")
    if not port_is_free(args.port):
        p.error(f"port {args.port} on 127.0.0.1 is in use; choose another with --port")

    specs, errors = load_specs(args.spec_dir)
    for error in errors.values():
        print(f"error: {error}", file=sys.stderr)
    if errors or not specs:
        print("error: fix the specs above first" if errors else f"error: no specs in {args.spec_dir}", file=sys.stderr)
        return 2
    if args.fresh and args.data_root.exists():
        shutil.rmtree(args.data_root)
    (args.data_root / "logs").mkdir(parents=True, exist_ok=True)

    platform = Platform(specs, args.spec_dir.resolve(), args.data_root.resolve(), args.port, args.rate,
                        args.events_per_file, args.master, out=lambda s: print(s, flush=True))

    def interrupt(_signum: int, _frame: object) -> None:
        platform.interrupts += 1
        print("\n==> Ctrl-C: shutting down gracefully (again to skip waiting)" if platform.interrupts == 1
              else "\n==> Ctrl-C again: not waiting any more", flush=True)

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    failed = None
    try:
        platform.start()
        platform.watch(args.minutes)
    except RuntimeError as exc:
        failed = str(exc)
        print(f"error: {exc}", file=sys.stderr)
    finally:
        platform.shutdown(graceful=failed is None)
    if failed is not None or not platform.deployed:
        return 1
    summary = platform.summary()
    (args.data_root / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print("\n" + "\n".join(describe_summary(summary)))
    print(f"\nsummary: {args.data_root / 'summary.json'}")
    ok = all(s["ground_truth_equal"] and s["quality_ok"] for s in summary["streams"].values())
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "up":
        print("usage: python -m streamops.embedded up [--minutes N] [--port P] ...", file=sys.stderr)
        return 2
    return up(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
