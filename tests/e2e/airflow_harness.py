"""Real services for end-to-end tests: Airflow's own services on loopback in a throwaway
home, and condition waits (never bare sleeps)."""

from __future__ import annotations

import re
from pathlib import Path

import psutil
from examples import example_spec, include_with  # noqa: F401 - used by the tests

from runner.airflow import AirflowServices
from runner.processes import BIN, free_port, wait_for, wait_until  # noqa: F401 - used by the tests
from spark_jobs.runtime.clock import epoch_seconds
from spark_jobs.runtime.lease import (
    history,
    overlaps,
)
from spark_jobs.runtime.progress import read_events
from spark_jobs.stream_spec.layout import Layout

ROOT = Path(__file__).resolve().parents[2]
#: screenshots of the pages the browser tests open
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def sign_in(page, url: str, user: str, password: str) -> None:  # a Playwright page
    """Log in to Airflow's UI at ``url`` as a user would, through its login form."""
    page.goto(f"{url}/")
    page.locator("input:not([type=password])").first.fill(user)
    page.locator("input[type=password]").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r".*/(home|dags)?/?$"), timeout=60_000)


class Airflow(AirflowServices):
    """Airflow's own services for one test, on loopback, in a throwaway home; by default
    without login (every request is an admin)."""

    def __init__(self, home: Path, data_root: Path, metadata_url: str | None = None, spark_master: str = "local[2]",
                 all_admins: bool = True, users: str = "admin:admin", passwords_file: Path | None = None,
                 extra_env: dict[str, str] | None = None):
        super().__init__(home, data_root, metadata_url=metadata_url, spark_master=spark_master,
                         all_admins=all_admins, users=users, passwords_file=passwords_file, extra_env=extra_env)


def stream_drivers() -> list[int]:
    """Python driver processes of the stream job, or a shared driver, on this machine."""
    pids = []
    for process in psutil.process_iter(["cmdline"]):
        argv = process.info["cmdline"] or []
        if len(argv) > 1 and argv[1].endswith(("stream_job.py", "shared_driver.py")) and "python" in argv[0]:
            pids.append(process.pid)
    return pids


def describe_processes(pids: list[int]) -> str:
    """What a test that finds processes left says of them: each one's command, parent, state and age."""
    import time

    lines = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            with process.oneshot():
                lines.append(f"pid {pid} ({process.status()}, {time.time() - process.create_time():.0f}s old, "
                             f"parent {process.ppid()}): {' '.join(process.cmdline())[:500]}")
        except psutil.Error as exc:
            lines.append(f"pid {pid}: {type(exc).__name__}")
    return "\n".join(lines)


def no_stream_drivers(timeout: float = 60) -> None:
    """Wait until no driver process of a stream is left on this machine; on timeout, name them."""
    if not wait_until(lambda: stream_drivers() == [], timeout, every=0.5):
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for the driver processes to exit:\n"
                             + describe_processes(stream_drivers()))


#: the events that record a committed batch: the ingestion's own (written inside the batch, after
#: its sinks) and Spark's progress (written after the commit)
COMMIT_EVENTS = frozenset({"ingested", "progress"})


def committed_at(event: dict) -> float:
    """When the batch an event records was done: a progress event's batch began at its ``timestamp``
    and ran ``triggerExecution`` (the listener writes the event later, and a paused process writes it
    only once resumed); the ingestion's own event is written inside the batch."""
    began = epoch_seconds(event.get("timestamp")) if event.get("event") == "progress" else None
    ran = (event.get("duration_ms") or {}).get("triggerExecution")
    return began + ran / 1000 if began is not None and isinstance(ran, int | float) else event["logged_at"]


def one_driver_at_a_time(layout: Layout) -> None:
    """Judge a stream's run by what matters, its lease's history: no two drivers held its checkpoint
    at once, and none committed after its epoch ended (every committed batch's event, of the
    ingestion and each output, names its driver's epoch and was done before the next epoch
    began: :func:`committed_at`). Another stream's driver, a standby that waits, or a driver that is dying without its
    lease (a resumed zombie whose query fails on the checkpoint the next driver moved on, and says
    so), is not a second driver."""
    records = history(layout.lease_dir)
    assert records, "no driver ever held the stream"
    assert overlaps(records) == [], f"two drivers held the checkpoint at once: {records}"
    starts = {h.epoch: h.started_at for h in records}
    for event in read_events(layout.events_file):
        if event.get("epoch") is None or event.get("event") not in COMMIT_EVENTS:
            continue  # not a commit, or not by a driver holding the lease (a standby warming, a supervisor)
        successor = starts.get(event["epoch"] + 1)
        assert successor is None or committed_at(event) < successor, \
            f"a driver of epoch {event['epoch']} committed after the next one took over: {event}"


def deploy(airflow: Airflow, stream: str) -> None:
    """Wait for the stream's DAGs to be parsed, unpause its run and stop DAGs, trigger the run DAG."""
    wait_for(lambda: {f"stream_{stream}", f"stream_{stream}_stop"} <= airflow.dag_ids(),
             f"the DAG processor to parse stream_{stream}", timeout=180, every=2)
    airflow.cli("dags", "unpause", f"stream_{stream}")
    airflow.cli("dags", "unpause", f"stream_{stream}_stop")
    airflow.cli("dags", "trigger", f"stream_{stream}")
