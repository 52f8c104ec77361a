"""A stream's health, read from its checkpoint, lease, landing directory (or Kafka broker) and
progress events.

The backlog is what waits for the ingestion: landed files it has not taken, or for a Kafka
source the records behind the broker's end offsets from where its newest committed batch
read up to (``spark_jobs.sources.kafka``), per partition.

:func:`snapshot` gathers the facts (no Spark, no Airflow: files, and a Kafka source's broker); :func:`classify`
decides what they mean:

=========  ==============================================================================
starting   the supervisor launched a driver that has not taken the lease yet (for at most the
           stall window), or a driver holds the lease, and a query with input waiting has
           committed nothing since it started
healthy    a driver is alive and commits batches
idle       a driver is alive and no input is waiting
lagging    a driver is alive and commits, but its backlog grew over the lag window and
           is more than one trigger takes
stalled    a query with input waiting has committed no batch within the stall window
dead       no live driver holds the checkpoint
corrupt    the checkpoint is unreadable or inconsistent; never restarted automatically
=========  ==============================================================================
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from spark_jobs.plan import StreamPlan
from spark_jobs.runtime.atomic import write_atomically
from spark_jobs.runtime.checkpoint import (
    QueryCheckpoint,
    batch_planned_by,
    file_name,
    landed_files,
    landing_backlog,
    planned_at,
    processed_files,
    read_query_checkpoint,
    sink_files,
    unread_accepted_files,
    waiting_files,
)
from spark_jobs.runtime.clock import ago
from spark_jobs.runtime.history import STREAM, History
from spark_jobs.runtime.lease import (
    holder_alive,
    latest,
    read_holder,
)
from spark_jobs.runtime.progress import read_events
from spark_jobs.sources.kafka import KafkaUnavailable, lag
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.models import (
    INGEST_FLOW,
    Restart,
    duration_seconds,
)
from streamops import tenure
from streamops.restarts import RestartBudget


class Status(StrEnum):
    STARTING = "starting"
    HEALTHY = "healthy"
    IDLE = "idle"
    LAGGING = "lagging"
    STALLED = "stalled"
    DEAD = "dead"
    CORRUPT = "corrupt"
    #: its input cannot be read on from where the checkpoint is (records deleted unread): an
    #: operator decides; a restart would fail the same way
    BLOCKED = "blocked"


#: Statuses a supervisor must act on.
NEEDS_ACTION = frozenset({Status.STALLED, Status.DEAD, Status.CORRUPT, Status.BLOCKED})
#: Statuses no restart mends: the supervisor fails loudly and leaves the checkpoint as it is.
NO_RESTART = frozenset({Status.CORRUPT, Status.BLOCKED})
#: Statuses of a stream that runs as it should.
RUNNING = (Status.HEALTHY, Status.IDLE, Status.LAGGING)


def backlog_text(records: int | None, files: int) -> str:
    """``12 record(s)`` for a Kafka source (``records`` known), else ``3 file(s)``."""
    return f"{records} record(s)" if records is not None else f"{files} file(s)"


@dataclass
class Snapshot:
    stream: str
    taken_at: float
    driver_alive: bool
    driver_pid: int | None
    driver_host: str | None
    driver_started_at: float | None
    queries: dict[str, QueryCheckpoint]
    backlog_files: int
    backlog_bytes: int
    max_files_per_trigger: int
    last_progress: dict[str, dict[str, Any]] = field(default_factory=dict)
    lag_window_seconds: float = 60.0
    #: per query: backlog in files one lag window ago (None: unknown) and now
    backlog_trend: dict[str, tuple[int | None, int]] = field(default_factory=dict)
    #: per query: when it last started (its ``started`` event), by any driver
    query_started_at: dict[str, float] = field(default_factory=dict)
    #: when the stream's supervisor last began to start a driver (its try began, or it launched
    #: one) after the last driver ended; None if it has not since
    launching_since: float | None = None
    #: a Kafka source: records behind in all (None: not a Kafka source, or the broker did not answer)
    backlog_records: int | None = None
    #: a Kafka source: records behind per partition (``topic/partition``)
    records_behind: dict[str, int] = field(default_factory=dict)
    #: a Kafka source: how many records one trigger takes (its limit, else what the last took)
    records_per_trigger: int = 0
    notes: list[str] = field(default_factory=list)
    #: the outputs an online upgrade rebuilds, held back by the driver (not stalled): its number
    held: dict[str, int] = field(default_factory=dict)
    #: why the source cannot be read on from the checkpoint (Kafka records deleted unread)
    blocked: list[str] = field(default_factory=list)
    #: the source's broker does not answer (what the probe said); None if it does, or not Kafka
    unreachable: str | None = None
    #: a Kafka source's figures taken from the supervisor's last measurement: when it was made
    backlog_measured_at: float | None = None
    #: a scheduled or adaptive stream (``execution.mode``): how long input may wait for a run, in seconds
    freshness_seconds: float | None = None
    #: since when the oldest input that waits has waited, at the latest (None: nothing waits, or unknown)
    waiting_since: float | None = None
    #: when the newest driver started (its ``driver_started`` event)
    last_run_started_at: float | None = None

    @property
    def scheduled(self) -> bool:
        return self.freshness_seconds is not None

    @property
    def kafka(self) -> bool:
        return self.backlog_records is not None

    @property
    def backlog_text(self) -> str:
        return backlog_text(self.backlog_records, self.backlog_files)

    @property
    def last_commit_time(self) -> float | None:
        times = [q.last_commit_time for q in self.queries.values() if q.last_commit_time]
        return max(times) if times else None


@dataclass
class Health:
    stream: str
    status: Status
    reason: str
    driver_pid: int | None
    #: the machine (worker) the driver runs on, as its lease names it (spark_jobs.runtime.lease.host_id)
    driver_host: str | None
    backlog_files: int
    backlog_bytes: int
    last_committed: dict[str, int | None]
    #: a Kafka source: records behind in all and per partition (None: not Kafka, or unknown)
    backlog_records: int | None
    last_commit_age_seconds: float | None
    watermark: str | None
    input_rows_per_second: float | None
    processed_rows_per_second: float | None
    problems: list[str]
    notes: list[str]
    checked_at: float
    records_behind: dict[str, int] = field(default_factory=dict)
    #: a Kafka source's records behind from the supervisor's last measurement: when it was made
    #: (None: measured by this check, or not Kafka)
    backlog_measured_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = str(self.status)
        return data

    @property
    def backlog_text(self) -> str:
        return backlog_text(self.backlog_records, self.backlog_files)

    def summary(self) -> str:
        return (f"stream {self.stream}: {self.status} ({self.reason}); backlog {self.backlog_text}; "
                f"last commit {ago(self.last_commit_age_seconds)}; watermark {self.watermark}; driver pid {self.driver_pid} on {self.driver_host}")


def snapshot(plan: StreamPlan, layout: Layout, now: float | None = None, measure: bool = True) -> Snapshot:
    """What the stream's files say now: ``plan``, the stream's plan; ``layout``, where its control
    files are. ``measure``: ask a Kafka source's broker how far behind the stream is (and keep the
    answer for the pages); else take the last answer kept, with its age (a page's request never
    waits on a broker)."""
    taken_at = time.time() if now is None else now
    source = plan.source
    lag_window = duration_seconds(plan.supervision.lag_window)
    queries = {name: read_query_checkpoint(plan.checkpoint(name)) for name in plan.flows}
    backlog = (0, 0)
    trend: dict[str, tuple[int | None, int]] = {}
    ingestion = queries.get(INGEST_FLOW)
    oldest_file = None
    if source is not None and source.is_files and source.landing is not None and ingestion is not None:
        # the ingestion's backlog: landed files it has not taken
        landed = landed_files(source.landing)
        waiting_now = waiting_files(landed, ingestion.processed_files)
        backlog = (len(waiting_now), sum(f.size for f in waiting_now))
        oldest_file = waiting_now[0].mtime if waiting_now else None
        trend[INGEST_FLOW] = (_backlog_at(landed, ingestion, taken_at - lag_window), backlog[0])
    if ingestion is not None:
        # an output's backlog: accepted files the ingestion committed and the output has not taken
        delta = plan.ingestion is not None and plan.ingestion.accepted_is_delta
        accepted = None if delta else {file_name(p) for p in sink_files(plan.accepted_path)}
        for name, q in queries.items():
            if name != INGEST_FLOW:
                trend[name] = (None, unread_accepted_files(plan, q, accepted))
    holder = read_holder(layout.lease_dir)
    alive = holder_alive(layout.lease_dir)
    last_progress: dict[str, dict[str, Any]] = {}
    query_started: dict[str, float] = {}
    driver_started = None
    refused_change = False  # the last driver refused to start: the spec changed in a way its checkpoint cannot take
    for event in read_events(layout.events_file):
        if event.get("event") == "progress":
            last_progress[event.get("query")] = event
        elif event.get("event") == "started" and isinstance(event.get("logged_at"), int | float):
            query_started[event.get("query")] = float(event["logged_at"])
        elif event.get("event") == "driver_started":
            driver_started, refused_change = event.get("logged_at"), False
        elif event.get("event") == "driver_failed":
            refused_change = bool(event.get("spec_changed"))
    changed = _refused_change(plan, layout) if refused_change and not alive else []
    kafka: dict[str, Any] = {}
    if source is not None and source.kafka is not None and ingestion is not None:
        progress = last_progress.get(INGEST_FLOW, {})
        kafka = (_kafka_backlog(plan, layout, taken_at, progress) if measure else _measured_backlog(layout, taken_at))
        earlier = History(layout.history_file).series(taken_at - lag_window - 30, taken_at - lag_window,
                                                      metrics=["backlog_records"]).get((STREAM, "backlog_records"), [])
        then = int(earlier[-1].last) if earlier else None
        if kafka.get("backlog_records") is not None:
            trend[INGEST_FLOW] = (then, kafka["backlog_records"])
    held = _held_by_upgrade(layout)
    scheduled = plan.execution.scheduled
    waiting_since = _waiting_since(queries, trend, oldest_file, driver_started) if scheduled else None
    kafka["notes"] = [*kafka.get("notes", []), *(f"output {name} is held while upgrade {number} rebuilds it"
                                                 for name, number in held.items())]
    return Snapshot(
        held=held, launching_since=None if alive else _launching_since(layout),
        stream=plan.stream, taken_at=taken_at, driver_alive=alive,
        driver_pid=holder.pid if holder and alive else None, driver_host=holder.host if holder and alive else None,
        driver_started_at=(holder.started_at if holder and alive else driver_started), queries=queries,
        backlog_files=backlog[0], backlog_bytes=backlog[1],
        max_files_per_trigger=(source.max_files_per_trigger or 1) if source is not None and source.is_files else 1,
        last_progress=last_progress, lag_window_seconds=lag_window, backlog_trend=trend,
        query_started_at=query_started, blocked=kafka.pop("blocked", []) + changed,
        freshness_seconds=duration_seconds(plan.execution.freshness) if scheduled else None,
        waiting_since=waiting_since, last_run_started_at=driver_started, **kafka,
    )


def _waiting_since(queries: dict[str, QueryCheckpoint], trend: dict[str, tuple[int | None, int]],
                   oldest_file: float | None, driver_started: float | None) -> float | None:
    """Since when the oldest input that waits has waited, at the latest: a landed file since it
    landed; any other (records on a topic, accepted rows an output has not read) since its query's
    last batch was planned, which took all there was then (the newest driver's start if none was)."""
    since = []
    for name, q in queries.items():
        if trend.get(name, (None, 0))[1] <= 0 and not q.batch_in_flight:
            continue
        if name == INGEST_FLOW and oldest_file is not None:
            since.append(oldest_file)
        else:  # a batch in flight (a run ended in it) holds input that came after the batch before it was planned
            last = q.last_planned - 1 if q.batch_in_flight and q.last_planned is not None else q.last_planned
            since.append(planned_at(q.path, last) or driver_started)
    known = [t for t in since if t is not None]
    return min(known) if known else None


def _held_by_upgrade(layout: Layout) -> dict[str, int]:
    """The outputs an online upgrade under way rebuilds, which its driver holds back: the upgrade's number of each."""
    from spark_jobs import upgrade

    record = upgrade.unfinished(layout)
    return {name: record["number"] for name in record["rebuild"]} if record and record.get("online") else {}


def _refused_change(plan: StreamPlan, layout: Layout) -> list[str]:
    """Why the stream's driver refused to start, if the spec still differs so (``spark_jobs.changes``):
    the flows a driver cannot resume, each with its first reason; empty once the spec was restored."""
    from spark_jobs import changes
    from spark_jobs.runtime.checkpoint import previous_plan

    spec_file = str(layout.spec_dir / f"{plan.stream}.yaml")
    event_time = plan.ingestion.event_time if plan.ingestion is not None else None
    verdicts = changes.judge(plan, previous_plan(layout), spec_file, event_time.watermark if event_time else None)
    refused = changes.blocking(verdicts)
    if not refused:
        return []
    flows = "; ".join(f"{'ingestion' if v.flow == INGEST_FLOW else v.flow}: {v.verdict}"
                      + (f" ({v.reasons[0]})" if v.reasons else "") for v in refused)
    return [f"spec changed: an upgrade is needed (docs/changes.md). A driver refuses to resume its checkpoint with "
             f"it: {flows}"]


#: how long the health of a Kafka stream waits for the broker
KAFKA_PROBE_SECONDS = 3.0


def _kafka_backlog(plan: StreamPlan, layout: Layout, now: float, progress: dict[str, Any]) -> dict[str, Any]:
    """A Kafka stream's backlog: records behind per partition (the broker's end offsets against
    the checkpoint) and how many a trigger takes; a note instead if the broker does not answer.
    ``progress``: the ingestion's newest progress event. Kept for the pages
    (:func:`_measured_backlog`)."""
    source, ingestion = plan.source, plan.ingestion
    assert source is not None and source.kafka is not None and ingestion is not None
    try:
        behind = lag(source.kafka, ingestion.checkpoint, source.reader_options, timeout=KAFKA_PROBE_SECONDS)
    except KafkaUnavailable as exc:
        measured: dict[str, Any] = {"notes": [f"records behind unknown: {exc}"], "unreachable": str(exc)}
    else:
        notes = [f"partition {t}/{p} appeared after the stream started; it is read from its first offset"
                 for t, p in behind.new_partitions]
        blocked = []
        if (lost := behind.lost_text()) is not None:
            if source.kafka.fail_on_data_loss:
                blocked.append(f"{lost}. The stream fails rather than skip them (source.fail_on_data_loss). To go "
                               "on without them, set fail_on_data_loss: false and deploy it again; to keep them, "
                               "restore the records and backfill")
            else:
                notes.append(f"{lost}; they are skipped (source.fail_on_data_loss: false)")
        per_trigger = source.kafka.max_offsets_per_trigger or int(progress.get("input_rows") or 0)
        measured = {"backlog_records": behind.total, "records_behind": behind.by_partition(), "notes": notes,
                    "blocked": blocked, "records_per_trigger": per_trigger}
    try:
        write_atomically(layout.records_behind_file, json.dumps({"measured_at": now, **measured}))
    except OSError:  # a read-only view of the checkpoint: the answer is still this caller's
        pass
    return measured


#: the fields of a kept measurement (:func:`_kafka_backlog`) that a snapshot takes
MEASURED = ("backlog_records", "records_behind", "notes", "blocked", "records_per_trigger", "unreachable")


def _measured_backlog(layout: Layout, now: float) -> dict[str, Any]:
    """A Kafka stream's backlog as the supervisor last measured it, with its age in a note; a
    note alone if it has not measured it yet."""
    try:
        kept = json.loads(layout.records_behind_file.read_text(encoding="utf-8"))
        measured_at = float(kept["measured_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return {"notes": ["records behind not measured yet (the stream's supervisor measures them against "
                          "the broker)"]}
    figures = {k: kept[k] for k in MEASURED if k in kept}
    figures["notes"] = [*kept.get("notes", []), f"records behind as measured {ago(now - measured_at)}"]
    figures["backlog_measured_at"] = measured_at
    return figures


def _launching_since(layout: Layout) -> float | None:
    """When the supervisor last began to start a driver (its try's start, or a run it recorded as
    started and not ended) after the last driver's tenure ended."""
    began = [t.started_at] if (t := tenure.current(layout.lease_dir)) is not None else []
    try:
        runs = RestartBudget(layout.runs_file, Restart()).runs()
    except ValueError:
        runs = []
    began += [r.started_at for r in runs[-1:] if r.ended_at is None]
    newest = max(began, default=None)
    last = latest(layout.lease_dir)
    ended = last.ended_at if last is not None else None
    return newest if newest is not None and (ended is None or newest >= ended) else None


def _backlog_at(landed: list, q: QueryCheckpoint, when: float) -> int | None:
    """The query's backlog at ``when``: files landed by then and not taken by a batch
    planned by then; None if the checkpoint no longer says what was planned then."""
    batch = batch_planned_by(q.path, when)
    if batch is None:
        return None
    taken = processed_files(q.path, through_batch=batch) if batch >= 0 else set()
    return landing_backlog(landed, taken, landed_by=when)[0]


def classify(snap: Snapshot, stall_window_seconds: float) -> tuple[Status, str]:
    problems = [p for q in snap.queries.values() for p in q.problems]
    if problems:
        return Status.CORRUPT, problems[0]
    if snap.blocked:
        return Status.BLOCKED, snap.blocked[0]
    if not snap.driver_alive:
        if snap.launching_since is not None and snap.taken_at - snap.launching_since <= stall_window_seconds:
            return Status.STARTING, (f"its supervisor began to start a driver {snap.taken_at - snap.launching_since:.0f}s "
                                     "ago; it has not taken the lease yet")
        if snap.scheduled:
            return _between_runs(snap)
        return Status.DEAD, "no live driver holds the checkpoint"
    started = snap.driver_started_at or snap.taken_at
    if snap.unreachable is not None:
        # the driver cannot read either: stalled once nothing committed for a stall window
        ingestion = snap.queries.get(INGEST_FLOW)
        quiet = snap.taken_at - max((ingestion.last_commit_time if ingestion else None) or 0.0, started)
        if quiet > stall_window_seconds:
            return Status.STALLED, (f"its source does not answer ({snap.unreachable}) and no batch committed for "
                                    f"{quiet:.0f}s (stall window {stall_window_seconds:.0f}s)")
        return Status.LAGGING, f"its source does not answer, records behind unknown: {snap.unreachable}"
    waiting = _waiting(snap)
    if waiting:
        # every query with input waiting must keep committing: the one quiet for longest decides
        # (a query that has taken all its input commits nothing, and that is not a stall). Its
        # clock starts at its last commit, or when this driver started it: a driver spends its
        # first seconds starting Spark and checking the spec, and a restarted query its first
        # batch replaying, none of which is a stall
        def quiet_for(item: tuple[str, QueryCheckpoint]) -> float:
            name, q = item
            return snap.taken_at - max(q.last_commit_time or 0.0, started, snap.query_started_at.get(name, 0.0))

        name, q = max(waiting.items(), key=quiet_for)
        quiet = quiet_for((name, q))
        if quiet > stall_window_seconds:
            return Status.STALLED, (f"input is waiting ({snap.backlog_text}) and query {name} has "
                                    f"committed nothing for {quiet:.0f}s (stall window {stall_window_seconds:.0f}s)")
        if any(q.last_commit_time is None or q.last_commit_time < started for q in waiting.values()):
            return Status.STARTING, "the driver started and has not committed a batch of every query with input yet"
    lagging = _lagging(snap)
    if lagging:
        return Status.LAGGING, lagging
    if not waiting:
        return Status.IDLE, "no input is waiting"
    return Status.HEALTHY, "committing batches"


def _between_runs(snap: Snapshot) -> tuple[Status, str]:
    """A scheduled stream between its runs holds no driver: idle if nothing waits, lagging once
    input waited longer than its freshness, healthy meanwhile."""
    assert snap.freshness_seconds is not None
    last = f"; the last run started {ago(snap.taken_at - snap.last_run_started_at)}" if snap.last_run_started_at else ""
    if not _waiting(snap):
        return Status.IDLE, f"scheduled: no input waits for a run{last}"
    waited = None if snap.waiting_since is None else max(0.0, snap.taken_at - snap.waiting_since)
    if waited is not None and waited > snap.freshness_seconds:
        return Status.LAGGING, (f"scheduled: input ({snap.backlog_text}) has waited {waited:.0f}s for a run, more "
                                f"than its freshness ({snap.freshness_seconds:.0f}s){last}")
    return Status.HEALTHY, (f"scheduled: {snap.backlog_text} wait{'' if waited is None else f' ({waited:.0f}s)'} "
                            f"for the next run, within its freshness ({snap.freshness_seconds:.0f}s){last}")


def _waiting(snap: Snapshot) -> dict[str, QueryCheckpoint]:
    """The queries with input waiting: files they have not taken, or a batch in flight."""
    return {name: q for name, q in snap.queries.items() if name not in snap.held
            and (q.batch_in_flight or snap.backlog_trend.get(name, (None, 0))[1] > 0)}


def _lagging(snap: Snapshot) -> str | None:
    """Why the ingestion's backlog grows (more than one trigger takes waits, and more than
    one lag window ago), or None. Without the earlier figure (the checkpoint purged it),
    a backlog above two triggers counts. Outputs take every accepted file at each trigger:
    one that falls behind shows as stalled, not lagging."""
    per_trigger, unit = (snap.records_per_trigger, "record(s)") if snap.kafka else (snap.max_files_per_trigger, "file(s)")
    for name, (then, now) in sorted(snap.backlog_trend.items()):
        if name != INGEST_FLOW:
            continue
        if now <= per_trigger:
            continue
        if then is not None and now > then:
            return (f"query {name}'s backlog grew from {then} to {now} {unit} in the last "
                    f"{snap.lag_window_seconds:.0f}s (a trigger takes {per_trigger})")
        if then is None and now > 2 * per_trigger:
            return f"query {name}: {now} {unit} wait, more than two triggers take ({per_trigger} each)"
    return None


def assess(plan: StreamPlan, layout: Layout, now: float | None = None, measure: bool = True) -> Health:
    """The stream's health now, from its plan and its control files (``layout``); ``measure``: as
    :func:`snapshot` (False on a page's request path)."""
    snap = snapshot(plan, layout, now, measure)
    status, reason = classify(snap, duration_seconds(plan.supervision.stall_window))
    progress = list(snap.last_progress.values())
    newest = max(progress, key=lambda e: e.get("logged_at", 0), default={})
    last = snap.last_commit_time
    return Health(
        stream=plan.stream, status=status, reason=reason, driver_pid=snap.driver_pid, driver_host=snap.driver_host,
        backlog_files=snap.backlog_files, backlog_bytes=snap.backlog_bytes,
        last_committed={name: q.last_committed for name, q in snap.queries.items()},
        last_commit_age_seconds=None if last is None else max(0.0, snap.taken_at - last),
        watermark=newest.get("watermark"),
        input_rows_per_second=newest.get("input_rows_per_second"),
        processed_rows_per_second=newest.get("processed_rows_per_second"),
        problems=[p for q in snap.queries.values() for p in q.problems] + snap.blocked,
        notes=[n for q in snap.queries.values() for n in q.notes] + snap.notes,
        checked_at=snap.taken_at, backlog_records=snap.backlog_records, records_behind=snap.records_behind,
        backlog_measured_at=snap.backlog_measured_at,
    )
