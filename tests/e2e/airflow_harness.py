"""Real services for end-to-end tests: Airflow's own services on loopback in a throwaway
home, and condition waits (never bare sleeps)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, what: str, timeout: float = 300, every: float = 0.5):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


class Airflow:
    """Airflow's own services for one test, on loopback, in a throwaway home."""

    SERVICES = (["api-server"], ["scheduler", "--skip-serve-logs"], ["dag-processor"], ["triggerer", "--skip-serve-logs"])

    def __init__(self, home: Path, data_root: Path, metadata_url: str | None = None, spark_master: str = "local[2]",
                 all_admins: bool = True, users: str = "admin:admin", passwords_file: Path | None = None):
        """``all_admins``: no login (every request is an admin); else ``users`` (name:role, ...) log in
        with the passwords Airflow generates into ``passwords_file``."""
        self.home = home
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.env = dict(
            os.environ,
            AIRFLOW_HOME=str(home), AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
            AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"), AIRFLOW__CORE__EXECUTOR="LocalExecutor",
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=metadata_url or f"sqlite:///{home}/airflow.db",
            # psycopg 3 serves SQLAlchemy's async engine too (Airflow would pick asyncpg otherwise)
            **({"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": metadata_url} if metadata_url else {}),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__UNIT_TEST_MODE="False", AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=str(all_admins),
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=users,
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(passwords_file or home / "passwords.json"),
            AIRFLOW__API__HOST="127.0.0.1", AIRFLOW__API__PORT=str(port),
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{port}/execution/",
            AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
            AIRFLOW_CONN_SPARK_STREAMS=json.dumps({"conn_type": "spark", "host": spark_master}),
            STREAMS_DATA_DIR=str(data_root), PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", TZ="UTC",
            PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}",
        )
        self.procs: list[subprocess.Popen] = []

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([str(BIN / "airflow"), *args], env=self.env, capture_output=True, text=True)
        if check and result.returncode != 0:
            raise AssertionError(f"airflow {' '.join(args)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
        return result

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.cli("db", "migrate")
        for service in self.SERVICES:
            log = open(self.home / f"{service[0]}.log", "w")  # noqa: SIM115 - closed with the process
            self.procs.append(subprocess.Popen([str(BIN / "airflow"), *service], env=self.env, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True))

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def healthy(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    def dag_ids(self) -> set[str]:
        result = self.cli("dags", "list", "-o", "json", check=False)
        return {d["dag_id"] for d in json_lines(result.stdout)} if result.returncode == 0 else set()

    def runs(self, dag_id: str) -> list[dict]:
        return json_lines(self.cli("dags", "list-runs", dag_id, "-o", "json").stdout)


def json_lines(stdout: str) -> list[dict]:
    """The JSON list an airflow CLI command printed (it may print log lines too)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("["):
            return json.loads(line)
    return []


def stream_drivers() -> list[int]:
    """Python driver processes of the stream job on this machine."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and argv[1].endswith(b"stream_job.py") and b"python" in argv[0]:
            pids.append(int(entry.name))
    return pids


class DriverWatcher:
    """Counts the stream's driver processes every 0.1 s between start and stop; ``most`` is the highest count."""

    def __init__(self) -> None:
        self.most = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._done.is_set():
            self.most = max(self.most, len(stream_drivers()))
            self._done.wait(0.1)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()


def deploy(airflow: Airflow, stream: str) -> None:
    """Wait for the stream's DAGs to be parsed, unpause its run and stop DAGs, trigger the run DAG."""
    wait_for(lambda: {f"stream_{stream}", f"stream_{stream}_stop"} <= airflow.dag_ids(),
             f"the DAG processor to parse stream_{stream}", timeout=180, every=2)
    airflow.cli("dags", "unpause", f"stream_{stream}")
    airflow.cli("dags", "unpause", f"stream_{stream}_stop")
    airflow.cli("dags", "trigger", f"stream_{stream}")
