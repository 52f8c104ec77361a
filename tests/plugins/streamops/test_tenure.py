"""Which try of a stream's supervisor task is current (streamops.tenure)."""

from __future__ import annotations

import threading
from pathlib import Path

from streamops import tenure


def test_the_newest_try_supersedes_every_earlier_one(tmp_path: Path) -> None:
    first = tenure.begin(tmp_path, "stream_s3 run r1 try 1")
    assert tenure.superseded_by(tmp_path, first) is None
    second = tenure.begin(tmp_path, "stream_s3 run r1 try 2")
    assert second.number == first.number + 1
    newer = tenure.superseded_by(tmp_path, first)
    assert newer is not None and newer.task == "stream_s3 run r1 try 2"
    assert tenure.superseded_by(tmp_path, second) is None
    assert tenure.current(tmp_path) == second


def test_tries_beginning_at_once_get_numbers_of_their_own(tmp_path: Path) -> None:
    began: list[tenure.Tenure] = []
    threads = [threading.Thread(target=lambda n=n: began.append(tenure.begin(tmp_path, f"try {n}"))) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(t.number for t in began) == list(range(1, 9))
    assert sum(tenure.superseded_by(tmp_path, t) is None for t in began) == 1
