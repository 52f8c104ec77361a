"""What a stream's drivers use, as its supervisor samples it: the CPU of its child processes,
counted whole to their exit (alive, then reaped), never twice; and the page's sums of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from spark_jobs.runtime.history import History
from spark_jobs.stream_spec.models import INGEST_FLOW
from streamops.cost import CPU, RSS, summary

ROOT = Path(__file__).resolve().parents[3]

#: a supervisor's process with one driver-like child that burns 0.6 s of CPU, then waits for stdin
SUPERVISOR = """
import json, subprocess, sys, time
import psutil
from streamops.cost import DriverCost

cost = DriverCost()
child = subprocess.Popen([sys.executable, "-c",
    "import sys, time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.6: pass\\nsys.stdin.read()"],
    stdin=subprocess.PIPE)
process = psutil.Process(child.pid)
while sum(process.cpu_times()[:2]) < 0.6:
    time.sleep(0.05)
alive, rss = cost.measure()
child.stdin.close()
child.wait()  # reaped: its CPU moves to this process's RUSAGE_CHILDREN
after, _ = cost.measure()
again, rss_gone = cost.measure()
print(json.dumps({"alive": alive, "rss": rss, "after": after, "again": again, "rss_gone": rss_gone}))
"""


def test_a_drivers_cpu_is_counted_while_it_runs_and_not_again_once_it_ended() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", SUPERVISOR], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert 0.6 <= seen["alive"] < 2.0 and seen["rss"] > 1, seen  # its CPU so far, its memory
    assert seen["after"] < 0.2 and seen["again"] == 0.0 and seen["rss_gone"] == 0.0, seen  # counted once


def test_the_page_sums_the_cost_of_the_last_hour_per_hour_and_per_1000_rows(tmp_path: Path) -> None:
    history = History(tmp_path / "history.db")
    now = time.time()
    for minutes_ago, cpu, rss in ((50, 12.0, 900.0), (20, 6.0, 1100.0), (5, 0.0, 0.0)):
        history.sample({CPU: cpu, RSS: rss}, at=now - 60 * minutes_ago)
    history.record(INGEST_FLOW, {"input_rows": 9000}, at=now - 60 * 50)
    history.record(INGEST_FLOW, {"input_rows": 3000}, at=now - 60 * 20)
    history.sample({CPU: 100.0, RSS: 4000.0}, at=now - 2 * 3600)  # before the hour: not counted
    assert summary(history, now - 3600, now) == {"cpu_seconds": 18.0, "cpu_seconds_per_hour": 18.0,
                                                 "peak_memory_mb": 1100, "rows": 12000,
                                                 "cpu_seconds_per_1000_rows": 1.5}
    assert summary(History(tmp_path / "none.db"), now - 3600, now)["cpu_seconds_per_1000_rows"] is None
