"""Read a query's checkpoint directory without Spark.

Layout (Spark 4.1, micro-batch):

* ``metadata``: ``{"id": "<query id>"}``
* ``offsets/<n>``: written before batch ``n`` runs (the write-ahead log): ``v1``, a
  metadata JSON line (watermark, batch timestamp, conf), then one offset line per source
  (a file source's log id; a Kafka source's end offset of each topic partition).
* ``commits/<n>``: written after batch ``n``'s output is committed: ``v1`` and a JSON line.
  Batch ``n + 1`` is planned only once ``n`` is committed, so the commit log trails the
  offsets log by at most one batch, unless commit files were lost.
* ``sources/<i>/<n>[.compact]``: the file source's log of files taken by each batch.
* ``state/``: state store files of stateful operators.

Spark writes every log file to a temporary ``.<n>.<uuid>.tmp`` and renames it, so a
leftover temporary file after a crash is harmless, and so is a lost commit file (the
batch is replayed, or, below a later commit, was already done; the platform's checkpoint
manager removes its checksum file ``.<n>.crc``, which Hadoop's local file system leaves
behind, before writing it again). A torn log file, or a lost
offsets or metadata file, is not: Spark either refuses to start or could skip work.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

from spark_jobs.plan import IngestionPlan, StreamPlan, own_accepted_path
from spark_jobs.sinks import delta_log

if TYPE_CHECKING:
    from spark_jobs.stream_spec.layout import Layout


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


@dataclass
class QueryCheckpoint:
    """What one query's checkpoint says, and what is wrong with it."""

    path: str
    exists: bool = False
    query_id: str | None = None
    last_planned: int | None = None
    last_committed: int | None = None
    last_commit_time: float | None = None  # mtime of the newest commit file
    watermark_ms: int | None = None
    processed_files: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)  # corruption: the stream must not be restarted blindly
    notes: list[str] = field(default_factory=list)  # harmless findings

    @property
    def corrupt(self) -> bool:
        return bool(self.problems)

    @property
    def batch_in_flight(self) -> bool:
        return self.last_planned is not None and self.last_planned != self.last_committed


def _read_log_file(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def _check_log_entry(path: Path, min_lines: int) -> str | None:
    """A problem with one offsets/commits file, or None."""
    try:
        lines = _read_log_file(path)
    except (OSError, UnicodeDecodeError) as exc:
        return f"{path} cannot be read: {exc}"
    if not lines or lines[0] != "v1":
        return f"{path} is truncated or not a Spark log file (first line {lines[0][:20] if lines else 'missing'!r})"
    if len(lines) < min_lines:
        return f"{path} is truncated: {len(lines)} lines, expected at least {min_lines}"
    for n, line in enumerate(lines[1:], start=2):
        try:
            json.loads(line)
        except json.JSONDecodeError:
            return f"{path} line {n} is not valid JSON (torn write?): {line[:60]!r}"
    return None


def read_query_checkpoint(path: str | os.PathLike[str], with_files: bool = True) -> QueryCheckpoint:
    """Read and check a query checkpoint. Only the newest entries are parsed in full."""
    root = Path(path)
    info = QueryCheckpoint(path=str(root), exists=root.is_dir())
    if not info.exists:
        return info
    offsets, commits = batch_ids(root, "offsets"), batch_ids(root, "commits")
    info.last_planned = offsets[-1] if offsets else None
    info.last_committed = commits[-1] if commits else None

    meta = root / "metadata"
    if meta.exists():
        try:
            info.query_id = json.loads(_read_log_file(meta)[0])["id"]
        except (OSError, IndexError, KeyError, ValueError) as exc:
            info.problems.append(f"{meta} is unreadable ({exc}); Spark cannot restart this query")
    elif offsets:
        info.problems.append(f"{meta} is missing although batches were run")

    if offsets:
        newest = root / "offsets" / str(offsets[-1])
        problem = _check_log_entry(newest, 3)
        if problem:
            info.problems.append(problem)
        else:
            try:
                info.watermark_ms = json.loads(_read_log_file(newest)[1]).get("batchWatermarkMs")
            except (ValueError, AttributeError):
                pass
    if commits:
        newest_commit = root / "commits" / str(commits[-1])
        problem = _check_log_entry(newest_commit, 2)
        if problem:
            info.problems.append(problem)
        info.last_commit_time = newest_commit.stat().st_mtime
        # a gap in the commit log means lost commit files: the batches ran (a later one was only
        # planned after them), their output is in the sinks, and Spark reads only the newest commit
        retained = [b for b in commits if b >= (offsets[0] if offsets else 0)]
        missing = sorted(set(range(retained[0], commits[-1] + 1)) - set(commits)) if retained else []
        if missing:
            info.notes.append(f"{root / 'commits'} has gaps: the commit file(s) of batch(es) {missing} were lost "
                              f"(harmless: later batches were committed after them)")
        if offsets and commits[-1] > offsets[-1]:
            info.problems.append(f"batch {commits[-1]} is committed but has no offsets entry (newest is "
                                 f"{offsets[-1]}): the offsets log lost files")
        if offsets and commits[-1] < offsets[-1] - 1:
            # Spark plans batch n+1 only after committing n, so only lost commit files lead here;
            # Spark re-runs the newest batch, and the sinks already hold the earlier ones
            info.notes.append(f"the offsets log is at batch {offsets[-1]} but the newest commit is {commits[-1]}: "
                              f"commit file(s) were lost; Spark replays batch {offsets[-1]} (the sinks hold the "
                              f"batches before it)")
    elif offsets and offsets[-1] > 0:
        info.problems.append(f"{root / 'commits'} is empty although {len(offsets)} batches were planned")

    for log in ("offsets", "commits"):
        try:
            temps = [n for n in os.listdir(root / log) if n.endswith(".tmp")]
        except FileNotFoundError:
            continue
        if temps:
            info.notes.append(f"{len(temps)} leftover temporary file(s) in {root / log} (harmless; Spark "
                              f"ignores them): {sorted(temps)[:3]}")
    if with_files:
        info.processed_files = processed_files(root)
    return info


def query_id(checkpoint: str | os.PathLike[str]) -> str | None:
    """The query id Spark keeps in ``<checkpoint>/metadata`` (new for every new checkpoint); None before it starts."""
    try:
        return json.loads(_read_log_file(Path(checkpoint) / "metadata")[0])["id"]
    except (OSError, UnicodeDecodeError, IndexError, KeyError, TypeError, ValueError):
        return None


def batch_watermark_ms(checkpoint: str | os.PathLike[str], batch: int) -> int | None:
    """The watermark batch ``batch`` ran with (from its offsets entry); None if unreadable.

    Once the batch is committed, a window ending at or before it is final in the sink,
    and rows with an earlier event time can no longer arrive."""
    try:
        return int(json.loads(_read_log_file(Path(checkpoint) / "offsets" / str(batch))[1])["batchWatermarkMs"])
    except (OSError, UnicodeDecodeError, IndexError, KeyError, TypeError, ValueError):
        return None


def watermark_to_catch_up(checkpoint: str | os.PathLike[str]) -> bool:
    """Whether the query owes a batch that only moves its watermark: its last committed batch
    ran with an older watermark than the one it committed for the next (``nextBatchWatermarkMs``),
    so Spark runs one more batch, without data, which emits the windows the newer watermark
    closes. Until then an append-mode window output lags what its input already decided."""
    last = last_batch(checkpoint, "commits")
    if last is None:
        return False
    try:
        committed = json.loads(_read_log_file(Path(checkpoint) / "commits" / str(last))[1])
        following = int(committed["nextBatchWatermarkMs"])
    except (OSError, UnicodeDecodeError, IndexError, KeyError, TypeError, ValueError):
        return False
    ran = batch_watermark_ms(checkpoint, last)
    return ran is not None and following > ran


def source_log_offset(checkpoint: str | os.PathLike[str], batch: int, source: int = 0) -> int | None:
    """The file source's own log id that stream batch ``batch`` read up to (its offsets entry).

    The source numbers its log entries itself, one per batch that found new files, so
    after a batch without new files the two numberings part; the offsets log maps them."""
    try:
        line = _read_log_file(Path(checkpoint) / "offsets" / str(batch))[2 + source]
        return int(json.loads(line)["logOffset"])
    except (OSError, UnicodeDecodeError, IndexError, KeyError, TypeError, ValueError):
        return None


def source_offsets(checkpoint: str | os.PathLike[str], batch: int, source: int = 0) -> object | None:
    """The offset a source's entry in batch ``batch``'s offsets file gives, as JSON (a
    Kafka source's ``{"topic": {"partition": offset}}``: where the batch read up to);
    None if it cannot be read."""
    try:
        return json.loads(_read_log_file(Path(checkpoint) / "offsets" / str(batch))[2 + source])
    except (OSError, UnicodeDecodeError, IndexError, TypeError, ValueError):
        return None


def reads_nothing(checkpoint: str | os.PathLike[str], batch: int) -> bool:
    """Whether stream batch ``batch`` reads no input: every source's offset in its offsets
    entry is the one the batch before read up to. Spark runs such a batch after one that
    moved the watermark, for its stateful operators to emit and evict what it passed.
    False when either entry cannot be read (or for batch 0)."""
    if batch < 1:
        return False
    try:
        this, before = (_read_log_file(Path(checkpoint) / "offsets" / str(b))[2:] for b in (batch, batch - 1))
    except (OSError, UnicodeDecodeError):
        return False
    return bool(this) and this == before


def processed_files(checkpoint: str | os.PathLike[str], source: int = 0, through_batch: int | None = None) -> set[str]:
    """Paths the file source has taken into batches, from its (compacted) log; with
    ``through_batch`` (a stream batch id, e.g. the last committed), only those that batch
    and the ones before it read; nothing if its offsets entry cannot be read."""
    through_log = None
    if through_batch is not None:
        through_log = source_log_offset(checkpoint, through_batch, source)
        if through_log is None:
            return set()
    return _log_paths(Path(checkpoint) / "sources" / str(source), through_log, batch_in_entry=True)


def _log_paths(log_dir: Path, through: int | None, batch_in_entry: bool = False) -> set[str]:
    """The paths of a compactible file log (a file source's ``sources/<n>`` or a file sink's
    ``_spark_metadata``): the newest compaction and the entries after it. With ``through``,
    only batches up to it: a source's entries carry their batch, a sink's are named by it
    (a compaction holds every batch up to its own)."""
    try:
        names = os.listdir(log_dir)
    except (FileNotFoundError, NotADirectoryError):
        return set()
    entries = []
    for name in names:
        stem = name.removesuffix(".compact")
        if stem.isdigit():
            entries.append((int(stem), name))
    entries.sort()
    compacts = [i for i, (_, name) in enumerate(entries) if name.endswith(".compact")]
    if through is not None and not batch_in_entry:
        compacts = [i for i in compacts if entries[i][0] <= through]
        entries = [e for e in entries if e[0] <= through]
    start = compacts[-1] if compacts else 0
    paths: set[str] = set()
    for _, name in entries[start:]:
        try:
            lines = _read_log_file(log_dir / name)
        except (OSError, UnicodeDecodeError):
            continue
        for line in lines[1:]:
            try:
                entry = json.loads(line)
                if batch_in_entry and through is not None and entry.get("batchId", -1) > through:
                    continue
                if entry.get("action", "add") == "delete":
                    paths.discard(entry["path"])
                else:
                    paths.add(entry["path"])
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
    return paths


def sink_files(table: str | os.PathLike[str], through_batch: int | None = None) -> set[str]:
    """Paths a file sink has committed (its ``_spark_metadata`` log, compactions included);
    with ``through_batch``, only those of that batch and the ones before it."""
    return _log_paths(Path(table) / "_spark_metadata", through_batch)


def sink_last_batch(table: str | os.PathLike[str]) -> int | None:
    """The newest batch in a file sink's ``_spark_metadata`` log."""
    try:
        names = [n.removesuffix(".compact") for n in os.listdir(Path(table) / "_spark_metadata")]
    except (FileNotFoundError, NotADirectoryError):
        return None
    ids = [int(n) for n in names if n.isdigit()]
    return max(ids) if ids else None


def accepted_last_batch(ingestion: IngestionPlan) -> int | None:
    """The newest ingestion batch with rows in the accepted-rows table; None if none yet."""
    if ingestion.accepted_is_delta:
        return delta_log.last_batch(ingestion.accepted_path)
    return sink_last_batch(ingestion.accepted_path)


def delta_read_through(reader: str | os.PathLike[str]) -> int | None:
    """The newest version of a Delta table that a query streaming from it has read whole by
    its last committed batch (-1: none yet); None if it has committed nothing."""
    last_read = last_batch(reader, "commits")
    return None if last_read is None else delta_log.read_through(source_offsets(reader, last_read))


def unread_accepted_files(plan: StreamPlan, reader: QueryCheckpoint, accepted: set[str] | None = None) -> int:
    """Files of the accepted-rows table that a query reading it has not taken yet
    (``accepted``: the Parquet table's files, if read already)."""
    assert plan.ingestion is not None
    if plan.ingestion.accepted_is_delta:
        read = delta_read_through(reader.path)
        return delta_log.files_after(plan.ingestion.accepted_path, -1 if read is None else read)
    if accepted is None:
        accepted = {file_name(p) for p in sink_files(plan.ingestion.accepted_path)}
    return len(accepted - {file_name(p) for p in reader.processed_files})


def watermark_seen_by(ingestion: str | os.PathLike[str], table: str | os.PathLike[str],
                      reader: str | os.PathLike[str], delta: bool = False) -> int | None:
    """The stream's watermark as far as a query reading its accepted-rows table has read it:
    the watermark of the newest ingestion batch J whose rows (and every earlier batch's)
    that query has committed. Rows accepted after J lie beyond that watermark, so every
    event-time unit ending by then is complete in the reader's sink. None if none yet.
    ``delta``: the table is a Delta table (its versions name their batches; a batch that
    accepted no row made none)."""
    last_read = last_batch(reader, "commits")
    last_ingested = last_batch(ingestion, "commits")
    if last_read is None or last_ingested is None:
        return None
    if delta:
        read = delta_log.read_through(source_offsets(reader, last_read))
        if read is None:
            return None
        unread = delta_log.batch_commits(table, query=query_id(ingestion), after=read)
        seen = last_ingested if not unread else min(last_ingested, unread[0].batch_id - 1)
        return batch_watermark_ms(ingestion, seen) if seen >= 0 else None
    taken = {file_name(p) for p in processed_files(reader, through_batch=last_read)}
    for batch in range(last_ingested, -1, -1):
        if {file_name(p) for p in sink_files(table, through_batch=batch)} <= taken:
            return batch_watermark_ms(ingestion, batch)
    return None


def batch_planned_by(checkpoint: str | os.PathLike[str], when: float) -> int | None:
    """The newest batch whose offsets entry was written at or before ``when``; -1 if none
    had been planned by then (no batch yet, or batch 0 came later); None if the entries
    of that time were purged."""
    offsets = Path(checkpoint) / "offsets"
    ids = batch_ids(checkpoint, "offsets")
    for batch in reversed(ids):
        try:
            if os.path.getmtime(offsets / str(batch)) <= when:
                return batch
        except FileNotFoundError:
            continue
    return -1 if not ids or ids[0] == 0 else None


def planned_at(checkpoint: str | os.PathLike[str], batch: int | None) -> float | None:
    """When ``batch`` was planned (its offsets entry written); None if unknown."""
    if batch is None:
        return None
    try:
        return os.path.getmtime(Path(checkpoint) / "offsets" / str(batch))
    except OSError:
        return None


def file_name(path: str) -> str:
    """Input files are known by name: the landing directory is flat, and URIs differ in encoding."""
    return unquote(path.rstrip("/").rsplit("/", 1)[-1])


@dataclass(frozen=True)
class LandedFile:
    name: str
    size: int
    mtime: float


def landed_files(landing: str | os.PathLike[str]) -> list[LandedFile]:
    """The landing directory's own files (the file source reads no sub-folders and skips
    names starting with ``.`` or ``_``)."""
    files = []
    try:
        with os.scandir(landing) as it:
            for entry in it:
                if entry.name.startswith((".", "_")) or not entry.is_file():
                    continue
                st = entry.stat()
                files.append(LandedFile(entry.name, st.st_size, st.st_mtime))
    except FileNotFoundError:
        pass
    return files


def landing_backlog(landing: str | os.PathLike[str] | list[LandedFile], processed: set[str],
                    landed_by: float | None = None) -> tuple[int, int]:
    """Files (and their bytes) in the landing directory that no batch has taken yet;
    with ``landed_by``, only files that had landed by then.

    A file is known by its name; that also survives the data folder being moved or
    mounted elsewhere."""
    waiting = waiting_files(landing, processed, landed_by)
    return len(waiting), sum(f.size for f in waiting)


def waiting_files(landing: str | os.PathLike[str] | list[LandedFile], processed: set[str],
                  landed_by: float | None = None) -> list[LandedFile]:
    """The files of :func:`landing_backlog`, oldest first."""
    files = landing if isinstance(landing, list) else landed_files(landing)
    seen = {file_name(p) for p in processed}
    waiting = [f for f in files if f.name not in seen and (landed_by is None or f.mtime <= landed_by)]
    return sorted(waiting, key=lambda f: (f.mtime, f.name))


def estimate_rows(landing: str | os.PathLike[str], waiting: list[LandedFile], header: bool,
                  sample: int = 3) -> int | None:
    """Rows in the waiting files, estimated: the rows per byte of up to ``sample`` of them (lines,
    less a header line each) times the bytes of all. None when none of them can be read."""
    lines = size = 0
    for f in waiting[:sample]:
        try:
            with open(Path(landing) / f.name, "rb") as handle:
                count = sum(1 for line in handle if line.strip())
        except OSError:
            continue
        lines, size = lines + max(0, count - (1 if header else 0)), size + f.size
    if not size:
        return None
    return round(lines / size * sum(f.size for f in waiting))


# ---- a checkpoint the plan can resume from ------------------------------------------------


def refuse_incompatible(plan: StreamPlan, layout: Layout) -> None:
    """Raise RuntimeError, saying what to move aside, when the checkpoint was written for a
    layout of the stream's tables this plan cannot resume from. (What a spec's edit changes, an
    accepted-rows table or a sink moved among them, is judged per flow by ``spark_jobs.changes``.)"""
    _refuse_old_layout(plan, layout)
    _refuse_written_output_layout(plan, layout)


def previous_plan(layout: Layout) -> dict:
    """The plan the last start wrote (``_control/plan.json``); empty if none or unreadable
    (an unreadable plan says nothing; the start writes a new one)."""
    try:
        previous = json.loads(layout.plan_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return previous if isinstance(previous, dict) else {}


def _refuse_old_layout(plan: StreamPlan, layout: Layout) -> None:
    old = Path(layout.checkpoint_root) / "_quarantine"
    if old.exists():
        raise RuntimeError(
            f"stream {plan.stream}: the checkpoint {layout.checkpoint_root} was written when every output parsed the "
            f"input itself ({old} exists); its outputs cannot resume from the accepted-rows table. Move the "
            "checkpoint aside together with the stream's sinks and quarantine to reprocess from the input.")


def _refuse_written_output_layout(plan: StreamPlan, layout: Layout) -> None:
    """The sink of the output the ingestion writes must not mix with what that output's own
    query wrote before.

    Before the ingestion wrote an output, that output had its own query (and
    checkpoint) writing its sink, with batch ids of its own in the sink's commit log, and
    the accepted rows lived in ``accepted/<stream>``, where the other outputs' checkpoints
    point. Resuming would have the ingestion skip or interleave batches in that log and
    the other outputs read a table they have never seen, so such a checkpoint is refused.
    """
    written = plan.output_written_by_ingestion
    if written is None:
        return
    sink = plan.accepted_path
    move = (f"Move aside the checkpoint {layout.checkpoint_root} together with the stream's sinks (including {sink}) "
            "and quarantine to reprocess from the input, or keep the output written by its own query by making it "
            "differ from the accepted rows (e.g. its columns or partitioning).")
    own = Path(written.former_checkpoint or Path(layout.checkpoint_root, written.name))
    if own.exists():
        raise RuntimeError(
            f"stream {plan.stream}: output {written.name} is now written by the ingestion (its sink {sink} is the "
            f"accepted-rows table), but its checkpoint {own} from when it had a query of its own exists. {move}")
    old = Path(layout.data(own_accepted_path(plan.stream)))
    if str(old) != sink and old.exists() and (sink_last_batch(old) is not None or any(old.iterdir())):
        raise RuntimeError(
            f"stream {plan.stream}: its accepted rows now live in the sink of output {written.name} ({sink}), but the "
            f"accepted-rows table {old} of the earlier layout holds data. {move} Move {old} aside as well.")
