"""Files written whole (spark_jobs.runtime.atomic): a reader never sees a part, writers never mix,
the permissions asked for are applied, and a failed write leaves the old file and no debris."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from spark_jobs.runtime.atomic import write_atomically


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_writes_text_and_bytes_and_creates_the_folder(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "state.json"
    assert write_atomically(target, '{"é": 1}\n') == target
    assert target.read_bytes() == '{"é": 1}\n'.encode()
    write_atomically(str(target), b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert leftovers(target.parent) == []


def test_mode_is_applied_and_the_default_follows_the_umask(tmp_path: Path) -> None:
    secret = write_atomically(tmp_path / "secret", "s3cret", mode=0o600)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    write_atomically(secret, "rotated", mode=0o600)  # replacing keeps it private
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    old = os.umask(0o027)
    try:
        plain = write_atomically(tmp_path / "plain", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(plain.stat().st_mode) == 0o640  # as open() would create it


def test_fsync_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    write_atomically(tmp_path / "f", "a")
    assert synced == []
    write_atomically(tmp_path / "f", "b", fsync=True)
    assert len(synced) == 1 and (tmp_path / "f").read_text() == "b"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    target = write_atomically(tmp_path / "ledger.json", "old")

    def broken(src: object, dst: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="disk gone"):
        write_atomically(target, "new")
    monkeypatch.undo()
    with pytest.raises(TypeError):
        write_atomically(target, 42)  # type: ignore[arg-type]  # fails while writing
    assert target.read_text() == "old"
    assert leftovers(tmp_path) == []


def test_readers_see_one_whole_version_while_writers_race(tmp_path: Path) -> None:
    target = tmp_path / "state"
    size = 256 * 1024
    versions = {bytes([c]) * size for c in b"abcd"}
    write_atomically(target, b"a" * size)
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(fill: bytes) -> None:
        try:
            while not stop.is_set():
                write_atomically(target, fill * size)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    writers = [threading.Thread(target=writer, args=(bytes([c]),)) for c in b"abcd"]
    for w in writers:
        w.start()
    try:
        for _ in range(300):
            data = target.read_bytes()
            assert data in versions, f"a partial or mixed file: {len(data)} bytes, {set(data)}"
    finally:
        stop.set()
        for w in writers:
            w.join()
    assert errors == []
    assert target.read_bytes() in versions
    assert leftovers(tmp_path) == []
