"""Read a query's checkpoint directory without Spark: its offset and commit logs.

``offsets/<n>`` is written before batch ``n`` runs (the write-ahead log); ``commits/<n>``
after its output is committed. Temporary files (``.<n>.<uuid>.tmp``) are ignored.
"""

from __future__ import annotations

import os
from pathlib import Path


def batch_ids(checkpoint: str | os.PathLike[str], log: str) -> list[int]:
    """Batch ids present in ``offsets`` or ``commits``, ascending."""
    try:
        names = os.listdir(Path(checkpoint) / log)
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def last_batch(checkpoint: str | os.PathLike[str], log: str) -> int | None:
    ids = batch_ids(checkpoint, log)
    return ids[-1] if ids else None
