"""Archiving: move input files the stream's ingestion has committed out of its landing directory.

Only the ingestion reads the landing directory (every output reads its accepted rows).
The platform archives a file only when

* the ingestion has committed it in a batch before its newest committed one (if the
  newest commit file is lost, Spark replays that batch, which must still find its
  files), and
* it landed at least the spec's ``source.archive_after`` ago.

The file source remembers the files it took in its log, so a moved file is neither
missed nor read again, and a restart lists a small directory. Backfills read the
accepted rows, not the archive: the archive is the input kept for people. A move is a rename on one file system; across file
systems the file is copied under a hidden name, renamed into place, then removed from
the landing directory, and a move cut short is completed by the next run.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from spark_jobs.plan import StreamPlan
from spark_jobs.runtime.checkpoint import (
    file_name,
    landed_files,
    last_batch,
    processed_files,
)
from spark_jobs.stream_spec.models import INGEST_FLOW, duration_seconds


@dataclass
class ArchiveResult:
    archived: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # a different file of that name is in the archive

    def describe(self) -> str:
        text = f"archived {len(self.archived)} file(s)"
        if self.conflicts:
            text += (f"; left {len(self.conflicts)} in place, a different file of the same name is archived "
                     f"already: {self.conflicts[:5]}")
        return text


def archivable(plan: StreamPlan, now: float | None = None) -> list[str]:
    """Names of landing files that may be archived now (see the module's rules)."""
    src = plan.source
    if src is None or not src.is_files or not src.archive_path or src.landing is None:
        return []
    checkpoint = plan.checkpoint(INGEST_FLOW)
    last = last_batch(checkpoint, "commits")
    if last is None or last < 1:
        return []
    committed = {file_name(p) for p in processed_files(checkpoint, through_batch=last - 1)}
    cutoff = (time.time() if now is None else now) - duration_seconds(src.archive_after)
    return sorted(f.name for f in landed_files(src.landing) if f.name in committed and f.mtime <= cutoff)


def archive(plan: StreamPlan, now: float | None = None) -> ArchiveResult:
    """Move what :func:`archivable` allows into the archive; safe to run at any time. The caller
    reports the result (the supervisor logs it in its task)."""
    result = ArchiveResult()
    names = archivable(plan, now)
    if not names:
        return result
    assert plan.source is not None and plan.source.landing and plan.source.archive_path
    landing, target = Path(plan.source.landing), Path(plan.source.archive_path)
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        src, dst = landing / name, target / name
        if dst.exists():
            if dst.stat().st_size == src.stat().st_size:  # a cross-device move cut short after its rename
                src.unlink()
                result.archived.append(name)
            else:
                result.conflicts.append(name)
            continue
        try:
            os.rename(src, dst)
        except OSError as exc:
            if exc.errno != errno.EXDEV:  # another file system: copy, then remove
                raise
            tmp = target / f".{name}.archiving"
            shutil.copy2(src, tmp)
            os.rename(tmp, dst)
            src.unlink()
        result.archived.append(name)
    return result
