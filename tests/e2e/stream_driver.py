"""One spark-submit of the stream job, as the e2e tests run it by hand: its own process group,
its output in a log file, killed with SIGKILL like a crashed machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from spark_jobs import submit

TIMEOUT = 240


def wait_for(condition: Callable[[], bool], what: str, proc: subprocess.Popen | None = None,
             timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"driver exited with {proc.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


class Driver:
    """One spark-submit of the stream job, in its own process group."""

    def __init__(self, spec_path: Path, data_root: Path, logs: Path, *extra: str):
        self.log_path = logs / f"driver-{len(list(logs.glob('driver-*.log')))}.log"
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, TZ="UTC", SPARK_LOCAL_IP="127.0.0.1",
                   PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
        cmd = submit.command("stream", spec_path, "local[2]", ["--data-root", str(data_root), *extra])
        cmd[3:3] = ["--conf", "spark.ui.enabled=false"]  # after spark-submit --master local[2]
        self.log = open(self.log_path, "w")  # closed in wait()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait(self, timeout: float = TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.log.close()

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.wait()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")
