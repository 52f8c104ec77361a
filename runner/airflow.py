"""Airflow's own services on loopback (``AirflowServices``), and the one client of its REST API
(``AirflowClient``): a CLI command costs seconds of CPU, the API answers in milliseconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests
from requests.adapters import HTTPAdapter
from urllib3.util import Retry

from runner.processes import BIN, PRIVATE, free_port, private_log
from spark_jobs.stream_spec.layout import project_root

#: answers worth another try: the API server starting, restarting or overloaded
RETRIED_STATUSES = (500, 502, 503, 504)


def healthy(url: str) -> bool:
    """Whether the API server at ``url`` answers its health check (one try: a poll is its own retry)."""
    try:
        return requests.get(f"{url}/api/v2/monitor/health", timeout=5).status_code == 200
    except requests.RequestException:
        return False


class AirflowClient:
    """Airflow's REST API (``/api/v2/...``), as one user.

    :param url: where the API server listens (``http://127.0.0.1:8080``).
    :param username: log in as this user (``POST /auth/token``); None: no login, for an Airflow
        whose every request is an admin (``simple_auth_manager_all_admins``).
    :param password: the user's password.
    :param timeout: seconds to wait for an answer.
    :param retries: tries more after a refused connection or an answer in ``RETRIED_STATUSES``
        (with backoff); only for requests that may be sent twice (not a POST: a second run).
    """

    def __init__(self, url: str, username: str | None = None, password: str | None = None, *,
                 timeout: float = 30, retries: int = 3):
        self.url = url.rstrip("/")
        self.username, self.password, self.timeout = username, password, timeout
        self.session = requests.Session()
        retry = Retry(total=retries, backoff_factor=0.5, status_forcelist=RETRIED_STATUSES,
                      allowed_methods=Retry.DEFAULT_ALLOWED_METHODS | {"PATCH"}, raise_on_status=False)
        self.session.mount("http://", HTTPAdapter(max_retries=retry))
        self.session.mount("https://", HTTPAdapter(max_retries=retry))
        self._token: str | None = None

    # -- requests

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                params: dict[str, Any] | None = None) -> Any:
        """The decoded answer of ``method /api/v2/<path>`` (None if empty); a RuntimeError on an error status."""
        path = path.lstrip("/")
        response = self._send(method, path, body, params)
        if response.status_code == 401 and self.username is not None:  # the token expired: a new one
            self._token = None
            response = self._send(method, path, body, params)
        if not response.ok:
            raise RuntimeError(f"Airflow API {method} /api/v2/{path}: HTTP {response.status_code} "
                               f"{response.content[:500]!r}")
        return response.json() if response.content else None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("POST", path, body)

    def patch(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("PATCH", path, body)

    def _send(self, method: str, path: str, body: dict[str, Any] | None,
              params: dict[str, Any] | None) -> requests.Response:
        headers = {} if self.username is None else {"Authorization": f"Bearer {self.token()}"}
        return self.session.request(method, f"{self.url}/api/v2/{path}", json=body, params=params,
                                    headers=headers, timeout=self.timeout)

    def token(self) -> str:
        """The user's access token: the one it has, or a new one."""
        if self._token is None:
            response = self.session.post(f"{self.url}/auth/token", timeout=self.timeout,
                                         json={"username": self.username, "password": self.password})
            if not response.ok:
                raise RuntimeError(f"Airflow login as {self.username}: HTTP {response.status_code} "
                                   f"{response.content[:500]!r}")
            self._token = response.json()["access_token"]
        return self._token

    # -- what the platform asks

    def healthy(self) -> bool:
        return healthy(self.url)

    def dag_ids(self) -> set[str]:
        return {d["dag_id"] for d in self.get("dags", limit=100)["dags"]}

    def runs(self, dag_id: str) -> list[dict]:
        """The DAG's runs, newest first: run_id, state, run_type, conf, ..."""
        runs = self.get(f"dags/{dag_id}/dagRuns", order_by="-run_after", limit=100)["dag_runs"]
        return [{"run_id": r["dag_run_id"], **r} for r in runs]

    def run(self, dag_id: str, run_id: str) -> dict:
        """One run of the DAG: state, start_date, end_date, ..."""
        return self.get(f"dags/{dag_id}/dagRuns/{quote(run_id, safe='')}")

    def unpause(self, dag_id: str) -> None:
        self.patch(f"dags/{dag_id}", {"is_paused": False})

    def stop_dag(self, dag_id: str) -> list[str]:
        """Pause the DAG and mark its running runs failed (Airflow kills their tasks, whose
        ``on_kill`` stops what they run), as an operator does in the UI; the runs it ended."""
        self.patch(f"dags/{dag_id}", {"is_paused": True})
        ended = [r["run_id"] for r in self.runs(dag_id) if r["state"] in ("running", "queued")]
        for run_id in ended:
            self.patch(f"dags/{dag_id}/dagRuns/{quote(run_id, safe='')}", {"state": "failed"})
        return ended

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        """Trigger a run of the DAG (as Airflow's own trigger form: now, with ``conf``); its run id."""
        return self.post(f"dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})["dag_run_id"]

    def import_errors(self) -> list[dict]:
        """The DAG files that failed to parse: filename, stack_trace, ..."""
        return self.get("importErrors", limit=100)["import_errors"]


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
        self._client: AirflowClient | None = None

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
        return healthy(self.url)

    # -- Airflow's REST API, with the CLI (which reads the database) while there is no API server yet

    @property
    def client(self) -> AirflowClient:
        """The REST client, as the first configured user (admin); made at first use, since the
        API server generates that user's password when it starts."""
        if self._client is None:
            if self.all_admins:
                self._client = AirflowClient(self.url)
            else:
                user = self.users.split(",")[0].split(":")[0]
                password = json.loads(self.passwords_file.read_text(encoding="utf-8"))[user]
                self._client = AirflowClient(self.url, user, password)
        return self._client

    def dag_ids(self) -> set[str]:
        try:
            return self.client.dag_ids()
        except (OSError, RuntimeError, ValueError, KeyError):
            result = self.cli("dags", "list", "-o", "json", check=False)
            return {d["dag_id"] for d in json_lines(result.stdout)} if result.returncode == 0 else set()

    def runs(self, dag_id: str) -> list[dict]:
        """The DAG's runs, newest first: run_id, state, run_type, conf, ..."""
        try:
            return self.client.runs(dag_id)
        except (OSError, RuntimeError, ValueError, KeyError):  # no API server (yet): the CLI reads the database
            return json_lines(self.cli("dags", "list-runs", dag_id, "-o", "json").stdout)

    def unpause(self, dag_id: str) -> None:
        self.client.unpause(dag_id)

    def stop_dag(self, dag_id: str) -> list[str]:
        """Pause the DAG and end its running runs (:meth:`AirflowClient.stop_dag`)."""
        return self.client.stop_dag(dag_id)

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        """Trigger a run of the DAG (as Airflow's own trigger form: now, with ``conf``); its run id."""
        return self.client.trigger(dag_id, conf)

    def import_errors(self) -> list[dict]:
        """The DAG files that failed to parse: filename, stack_trace, ..."""
        try:
            return self.client.import_errors()
        except (OSError, RuntimeError, ValueError, KeyError):
            return [{"filename": e.get("filepath"), "stack_trace": e.get("error", ""), **e}
                    for e in json_lines(self.cli("dags", "list-import-errors", "-o", "json", check=False).stdout)]


def json_lines(stdout: str) -> list[dict]:
    """The JSON list an airflow CLI command printed (it may print log lines too)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("["):
            return json.loads(line)
    return []
