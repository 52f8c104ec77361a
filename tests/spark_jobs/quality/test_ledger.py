"""The quality ledger: atomic saves, and one validation run of a stream at a time."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spark_jobs.quality.ledger import Ledger, run_lock

HOLDER = """
import sys
from spark_jobs.quality.ledger import run_lock
with run_lock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_a_second_run_waits_for_the_lock_until_the_first_ends(tmp_path: Path, caplog) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    acquired = threading.Event()

    def second_run() -> None:
        with run_lock(tmp_path):
            acquired.set()

    try:
        with caplog.at_level(logging.INFO, logger="spark_jobs.quality.ledger"):
            thread = threading.Thread(target=second_run)
            thread.start()
            deadline = time.monotonic() + 30
            while "waiting for it to end" not in caplog.text:  # condition wait: the second run found the lock held
                assert time.monotonic() < deadline, "the second run did not report waiting"
                time.sleep(0.01)
            assert not acquired.is_set()
            holder.stdin.write("done\n")
            holder.stdin.flush()
            thread.join(30)
        assert acquired.is_set()
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()


def test_a_lock_left_by_a_killed_run_does_not_block(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    with run_lock(tmp_path):  # the operating system released it with the process
        pass


def test_saves_are_atomic_and_an_unreadable_ledger_is_named(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.json")
    ledger.record_run({"run_id": "r1"})
    ledger.save()
    assert json.loads((tmp_path / "ledger.json").read_text())["runs"] == [{"run_id": "r1"}]
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]  # no temporary file left
    (tmp_path / "ledger.json").write_text("{torn")
    with pytest.raises(ValueError, match="ledger.json is unreadable"):
        Ledger(tmp_path / "ledger.json")
