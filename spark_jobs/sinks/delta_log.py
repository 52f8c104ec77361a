"""A Delta table's log read without Spark: which version holds which batch of a stream, and
how far a streaming reader of the table has read.

Every version ``v`` of a table is the JSON file ``_delta_log/<v:020d>.json``: one action per
line (``commitInfo``, ``txn``, ``add``, ``remove``, ...). The platform's writers put what a
commit is in its ``commitInfo.userMetadata`` (``spark_jobs.sinks.delta.commit_metadata``:
stream, output, query, batch, epoch); a compaction's commit carries none and changes no
data. Delta keeps these files for its log retention (30 days by default), beyond any
version a running stream still needs.

A Delta streaming source's offset (one line of its reader's ``offsets/<n>``) is
``{"reservoirVersion": v, "index": i, "isStartingVersion": s}``: with ``index`` -1, every
version before ``v`` is read and none of ``v``; with ``s``, the reader is still reading the
table's snapshot at ``v`` (nothing of the versions is read whole until it is done).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

#: the index of a Delta source's offset before any file of its version
BASE_INDEX = -1
#: an index at or beyond this marks the end of its version (Delta's ``END_INDEX``)
END_INDEX = 2**63 - 1 - 100


@dataclass(frozen=True)
class BatchCommit:
    version: int
    batch_id: int
    query: str | None
    files: int  # data files the commit added


def log_dir(table: str | os.PathLike[str]) -> Path:
    return Path(table) / "_delta_log"


def versions(table: str | os.PathLike[str]) -> list[int]:
    """The versions whose commit files the log holds, ascending (none: no table yet)."""
    try:
        names = os.listdir(log_dir(table))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())


def actions(table: str | os.PathLike[str], version: int) -> list[dict] | None:
    """The actions of one version, or None if its file is gone or unreadable."""
    try:
        text = (log_dir(table) / f"{version:020d}.json").read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def batch_commit(table: str | os.PathLike[str], version: int) -> BatchCommit | None:
    """The stream's batch that wrote ``version``, if a stream's batch did."""
    found = actions(table, version)
    if found is None:
        return None
    said, files = None, 0
    for action in found:
        if "commitInfo" in action:
            try:
                said = json.loads(action["commitInfo"].get("userMetadata") or "null")
            except (ValueError, TypeError):
                said = None
        elif "add" in action and action["add"].get("dataChange", True):
            files += 1
    if not isinstance(said, dict) or not isinstance(said.get("batch_id"), int):
        return None
    return BatchCommit(version, said["batch_id"], said.get("query"), files)


def batch_commits(table: str | os.PathLike[str], query: str | None = None, after: int = -1,
                  through: int | None = None) -> list[BatchCommit]:
    """The versions in (``after``, ``through``] written by batches (of query ``query`` if
    given), ascending."""
    found = []
    for version in versions(table):
        if version <= after or (through is not None and version > through):
            continue
        commit = batch_commit(table, version)
        if commit is not None and (query is None or commit.query == query):
            found.append(commit)
    return found


def last_batch(table: str | os.PathLike[str], query: str | None = None, through: int | None = None) -> int | None:
    """The newest batch (of ``query``) among the versions up to ``through`` (all), reading
    the newest versions first."""
    for version in reversed(versions(table)):
        if through is not None and version > through:
            continue
        commit = batch_commit(table, version)
        if commit is not None and (query is None or commit.query == query):
            return commit.batch_id
    return None


def read_through(offset: object) -> int | None:
    """The newest version a Delta source's ``offset`` has read whole; -1 if none; None if
    ``offset`` is not a Delta source's."""
    if not isinstance(offset, dict) or "reservoirVersion" not in offset:
        return None
    version, index = int(offset["reservoirVersion"]), int(offset.get("index", BASE_INDEX))
    if offset.get("isStartingVersion"):
        return version if index >= END_INDEX else -1
    return version if index >= END_INDEX else version - 1


def files_after(table: str | os.PathLike[str], version: int) -> int:
    """Data files added by the batches' versions after ``version`` (what a reader there has yet to read)."""
    return sum(c.files for c in batch_commits(table, after=version))


def partition_values(table: str | os.PathLike[str], column: str) -> set[str]:
    """The values (as text) a partition column has across the files of the table's newest version,
    read with the ``deltalake`` package; empty while there is no table."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        adds = DeltaTable(str(table)).get_add_actions(flatten=True)
    except TableNotFoundError:
        return set()
    name = f"partition.{column}"
    if name not in adds.schema.names:
        return set()
    return {str(v) for v in adds.column(name).to_pylist() if v is not None}
