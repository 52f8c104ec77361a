"""Processes of the benchmarks: the trees spark-submit starts, their memory, their end.

Imported by the benchmark scripts (``python bench/<script>.py`` puts this folder on the path).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from spark_jobs.spec.layout import project_root

MASTER = "local[2]"



def descendants(root: int) -> list[int]:
    """The pids of every process descended from ``root``; none if it is gone."""
    try:
        return [p.pid for p in psutil.Process(root).children(recursive=True)]
    except (psutil.Error, ValueError):
        return []


def cmdline(pid: int) -> bytes:
    """The process's arguments, separated by NUL bytes; empty if it is gone (or a zombie)."""
    try:
        return b"\0".join(map(os.fsencode, psutil.Process(pid).cmdline()))
    except (psutil.Error, ValueError):
        return b""


def rss_bytes(pid: int) -> int:
    """The process's resident memory, 0 if it is gone."""
    try:
        return psutil.Process(pid).memory_info().rss
    except (psutil.Error, ValueError):
        return 0


def pss_bytes(pid: int) -> int:
    """The process's proportional share of the memory it maps: pages shared with other processes
    (forked Python workers, a JVM's shared libraries) count once across them, so sums hold.
    0 if it is gone."""
    try:
        return psutil.Process(pid).memory_full_info().pss
    except (psutil.Error, ValueError):
        return 0


def cpu_seconds(root: int) -> float:
    """User and system CPU time of ``root`` and its live descendants (a JVM and its Python
    workers), and of the children they have waited for."""
    total = 0.0
    for pid in [root, *descendants(root)]:
        try:
            t = psutil.Process(pid).cpu_times()
        except (psutil.Error, ValueError):
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def kill_pids(pids: dict[int, bytes]) -> None:
    """SIGKILL each pid still running the command line it had when it was recorded."""
    for pid, cmd in pids.items():
        if cmd and cmdline(pid) == cmd:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def kill_tree(root: int) -> None:
    """SIGKILL ``root`` and its descendants (recorded first, so that none escapes by being reparented)."""
    kill_pids({pid: cmdline(pid) for pid in [*descendants(root), root]})


class PeakRss(threading.Thread):
    """Peak resident memory of one spark-submit: its JVM and every Python process under it.
    ``measure``: of one process, :func:`rss_bytes` (default) or :func:`pss_bytes`;
    ``include_root``: False to measure only the root's descendants (every spark-submit this
    process started)."""

    def __init__(self, root: int, every: float = 0.2, measure: Callable[[int], int] = rss_bytes,
                 include_root: bool = True):
        super().__init__(daemon=True)
        self.root, self.every, self.measure, self.include_root = root, every, measure, include_root
        self.jvm = self.python = self.total = 0
        self.seen: dict[int, bytes] = {}  # every process of the tree seen, with its command line
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            jvm = python = 0
            for pid in [self.root, *descendants(self.root)] if self.include_root else descendants(self.root):
                cmd = cmdline(pid)
                self.seen.setdefault(pid, cmd)
                argv = cmd.split(b"\0")
                if b"org.apache.spark.deploy.SparkSubmit" in argv:
                    jvm += self.measure(pid)
                elif os.path.basename(argv[0]).startswith(b"python"):
                    python += self.measure(pid)
            self.jvm, self.python = max(self.jvm, jvm), max(self.python, python)
            self.total = max(self.total, jvm + python)
            self._done.wait(self.every)

    def stop(self) -> dict[str, float]:
        self._done.set()
        self.join()
        return {"peak_rss_mb": self.total / 2**20, "peak_jvm_mb": self.jvm / 2**20,
                "peak_python_mb": self.python / 2**20}


def child_env() -> dict[str, str]:
    root = str(project_root())
    path = os.pathsep.join([root, str(project_root() / "plugins"), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, TZ="UTC", SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=path,
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("STREAMS_DB_URL", None)  # tables of specs without a url go to <data root>/tables.db
    return env


def spark_submit(args: list[str], log: Path, timeout: float, jars: list[str] | None = None,
                 conf: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``spark-submit --master local[2] [--jars ...] [--conf ...] <args>``; exit code, wall time, peak memory."""
    confs = [arg for k, v in (conf or {}).items() for arg in ("--conf", f"{k}={v}")]
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", MASTER,
           *(["--jars", ",".join(jars)] if jars else []), "--conf", "spark.ui.showConsoleProgress=false", *confs, *args]
    with open(log, "w") as out:
        started = time.time()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env())
        sampler = PeakRss(proc.pid)
        sampler.start()
        try:
            code = proc.wait(timeout)
        except BaseException:
            kill_tree(proc.pid)
            proc.wait()
            raise
        finally:
            memory = sampler.stop()
            kill_pids(sampler.seen)  # nothing of it outlives it (a Python worker left behind)
        wall = time.time() - started
    return {"exit_code": code, "wall_s": wall, "started_at": started, **memory}
