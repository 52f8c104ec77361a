"""Real services for end-to-end tests: Airflow's own services on loopback in a throwaway
home, and condition waits (never bare sleeps)."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import yaml

from streamops.embedded import BIN, AirflowServices, free_port, json_lines, wait_for  # noqa: F401 - used by the tests

ROOT = Path(__file__).resolve().parents[2]


def example_spec(name: str) -> dict:
    """The project's example spec ``name`` (``include/streams/<name>.yaml``), as a dict to change."""
    return yaml.safe_load((ROOT / "include" / "streams" / f"{name}.yaml").read_text())


def include_with(root: Path, *specs: dict) -> Path:
    """An ``include/`` under ``root``: the project's expectations and reference data, and the
    given stream specs; its ``streams`` folder (the spec directory to point the platform at)."""
    for folder in ("expectations", "reference"):
        shutil.copytree(ROOT / "include" / folder, root / folder, dirs_exist_ok=True)
    (root / "streams").mkdir(parents=True, exist_ok=True)
    for spec in specs:
        (root / "streams" / f"{spec['name']}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return root / "streams"


class Airflow(AirflowServices):
    """Airflow's own services for one test, on loopback, in a throwaway home; by default
    without login (every request is an admin)."""

    def __init__(self, home: Path, data_root: Path, metadata_url: str | None = None, spark_master: str = "local[2]",
                 all_admins: bool = True, users: str = "admin:admin", passwords_file: Path | None = None,
                 extra_env: dict[str, str] | None = None):
        super().__init__(home, data_root, metadata_url=metadata_url, spark_master=spark_master,
                         all_admins=all_admins, users=users, passwords_file=passwords_file, extra_env=extra_env)


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
