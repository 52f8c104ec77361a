"""The triggerer's watchers and waits (see the modules of this package), and the file reads they share."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def file_state(path: Path) -> tuple[int, int, int] | None:
    """What tells a file's change: its mtime, size and inode; None if it is not there."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_mtime_ns, found.st_size, found.st_ino


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object kept in a file; empty if the file is missing or holds something else."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
