"""What the Streams pages draw, as data: a stream's charts over a range, its flow graph, its trend.

All of it is read from files, without Spark: the stream's history (:mod:`spark_jobs.runtime.history`,
folded from the driver's progress events and the supervisor's backlog samples), its runs
(``runs.json``: starts, restarts, stops), its quality ledger (validations and their results)
and the health the checkpoint shows. The pages' script (``static/streams.js``) draws it with
Plotly, which the project installs (no CDN).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from spark_jobs.plan import DeltaDataset, OutputPlan, ParquetDataset, StreamPlan, TableDataset
from spark_jobs.quality.ledger import read_ledger
from spark_jobs.runtime.clock import epoch_seconds, iso
from spark_jobs.runtime.history import (
    MINUTE,
    STREAM,
    History,
    Point,
)
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.models import (
    INGEST_FLOW,
    duration_seconds,
)
from streamops.cost import CPU, RSS

RANGES = {"15m": 900.0, "1h": 3600.0, "24h": 86400.0}
DEFAULT_RANGE = "1h"
TREND_SECONDS = 900.0


class RangeError(ValueError):
    """A range the pages do not offer."""


def range_seconds(key: str) -> float:
    if key not in RANGES:
        raise RangeError(f"range must be one of {', '.join(RANGES)}, not {key!r}")
    return RANGES[key]


def _label(query: str) -> str:
    return "ingestion" if query == INGEST_FLOW else query


def _trace(name: str, points: list[Point], value: Callable[[Point], float | None], **style: Any) -> dict[str, Any]:
    pairs = [(iso(p.at), value(p)) for p in points]
    pairs = [(x, round(y, 3)) for x, y in pairs if y is not None]
    return {"name": name, "x": [x for x, _ in pairs], "y": [y for _, y in pairs], **style}


def _queries(data: dict[tuple[str, str], list[Point]]) -> list[str]:
    return sorted({q for q, _ in data if q != STREAM}, key=lambda q: (q != INGEST_FLOW, q))


def charts(plan: StreamPlan, layout: Layout, range_key: str = DEFAULT_RANGE, now: float | None = None) -> dict[str, Any]:
    """The stream's charts over the range: each a title, a y-axis title and its traces; and the
    markers (restarts, stops, validations) to draw on every chart's time axis. ``plan``: the
    stream's; ``layout``: where its history, runs and quality ledger are."""
    seconds = range_seconds(range_key)
    now = time.time() if now is None else now
    since = now - seconds
    history = History(layout.history_file)
    tier = history.tier_for(since, now)
    data = history.series(since, now, tier=tier)
    per_minute = tier == MINUTE
    queries = _queries(data)
    ingesting = plan.ingestion is not None

    def points(query: str, metric: str) -> list[Point]:
        return data.get((query, metric), [])

    rates = []
    if INGEST_FLOW in queries or not ingesting:
        first = INGEST_FLOW if ingesting else (queries[0] if queries else None)
        if first is not None:
            rates.append(_trace("input", points(first, "input_rows") if per_minute else points(first, "input_rps"),
                                (lambda p: p.sum / MINUTE) if per_minute else (lambda p: p.last)))
    for q in queries:
        rates.append(_trace(f"{_label(q)}: processed", points(q, "processed_rps"), lambda p: p.mean,
                            line={"dash": "solid" if q == INGEST_FLOW else "dot"}))

    durations = [_trace(_label(q), points(q, "batch_ms"), lambda p: p.mean / 1000) for q in queries]
    trigger = plan.trigger.processing_time if plan.application is None else None  # an application has its own
    if trigger:
        interval = duration_seconds(trigger)
        durations.append({"name": f"trigger interval ({trigger})", "x": [iso(since), iso(now)],
                          "y": [interval, interval], "line": {"dash": "dash", "color": "#888"}, "mode": "lines"})
    sized = plan.execution.sizing
    if trigger and sized is not None and (sized.min_trigger or sized.max_trigger):  # the interval sized by lag
        durations.append(_trace("trigger interval: recommended (sizing by lag)", points(STREAM, "trigger_recommended_s"),
                                lambda p: p.last, line={"dash": "dot", "shape": "hv"}))
        durations.append(_trace("trigger interval: the driver's (sizing by lag)", points(STREAM, "trigger_applied_s"),
                                lambda p: p.last, line={"shape": "hv"}))

    source = plan.source
    kafka = source is not None and source.kafka is not None
    if kafka:  # records behind: the checkpoint against the broker, beside Spark's own count
        backlog = [_trace("records behind (checkpoint against broker)", points(STREAM, "backlog_records"),
                          lambda p: p.max),
                   _trace("Spark's maxOffsetsBehindLatest", points(INGEST_FLOW, "offsets_behind"), lambda p: p.max,
                          line={"dash": "dot"})]
    else:
        backlog = [_trace("files waiting", points(STREAM, "backlog_files"), lambda p: p.max),
                   _trace("rows waiting (estimated)", points(STREAM, "backlog_rows"), lambda p: p.max, yaxis="y2")]

    sizing = plan.execution.sizing
    if sizing is not None and ingesting and source is not None:
        # what a batch may take: the source's own limit, what sizing recommends, and what the driver takes
        own = source.kafka.max_offsets_per_trigger if source.kafka is not None else source.max_files_per_trigger
        if own:
            backlog.append({"name": f"per trigger: the source's own ({own})", "x": [iso(since), iso(now)],
                            "y": [own, own], "line": {"dash": "dash", "color": "#888"}, "mode": "lines"})
        backlog.append(_trace("per trigger: recommended (sizing by lag)", points(STREAM, "per_trigger_recommended"),
                              lambda p: p.last, line={"dash": "dot", "shape": "hv"}))
        backlog.append(_trace("per trigger: the driver's (sizing by lag)", points(STREAM, "per_trigger_applied"),
                              lambda p: p.last, line={"shape": "hv"}))
    lag = [_trace(_label(q), points(q, "lag_s"), lambda p: p.max) for q in queries if points(q, "lag_s")]
    state = [_trace(_label(q), points(q, "state_rows"), lambda p: p.last) for q in queries if points(q, "state_rows")]

    classified = {p.at: p.sum for p in points(INGEST_FLOW, "classified")}
    share = _trace("quarantined share", points(INGEST_FLOW, "quarantined"),
                   lambda p: 100.0 * p.sum / classified[p.at] if classified.get(p.at) else None)

    cost = history.series(since, now, tier=MINUTE, metrics=[CPU, RSS])  # per minute at every range: a run is seconds
    costs = [_trace("driver CPU seconds per minute", cost.get((STREAM, CPU), []), lambda p: p.sum),
             _trace("driver memory (MB)", cost.get((STREAM, RSS), []), lambda p: p.max, yaxis="y2")]

    every = "per minute" if per_minute else "per batch"
    return {
        "stream": plan.stream, "range": range_key, "since": iso(since), "until": iso(now),
        "resolution": every,
        "charts": [
            {"id": "rates", "title": f"Rows per second ({every})", "y": "rows/s", "traces": rates},
            {"id": "durations", "title": "Batch duration against the trigger interval", "y": "seconds",
             "traces": durations},
            {"id": "backlog", "title": "Backlog: Kafka records behind" if kafka else "Backlog: files and rows waiting",
             "y": "records" if kafka else "files", "y2": "rows", "traces": backlog if ingesting else []},
            {"id": "lag", "title": "Event-time lag (batch time minus watermark)", "y": "seconds", "traces": lag},
            {"id": "state", "title": "State rows", "y": "rows", "traces": state},
            {"id": "quarantine", "title": "Quarantined share of the rows the ingestion classified", "y": "%",
             "traces": [share] if ingesting else []},
            {"id": "cost", "title": "What its drivers use: CPU seconds per minute, and memory", "y": "CPU seconds",
             "y2": "MB", "traces": costs},
        ],
        "markers": markers(layout, since, now),
    }


def markers(layout: Layout, since: float, until: float) -> list[dict[str, Any]]:
    """Starts, restarts, stops and failures of the stream's driver (its runs), an adaptive stream's
    switches between continuous and scheduled, and validations."""
    out: list[dict[str, Any]] = []
    try:
        runs = json.loads(layout.runs_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        runs = []
    previous: dict[str, Any] | None = None
    for run in runs if isinstance(runs, list) else []:
        started, ended = run.get("started_at"), run.get("ended_at")
        if isinstance(started, int | float) and since <= started <= until:
            clean = previous is None or previous.get("requested") or previous.get("exit_code") == 0
            out.append({"at": iso(started), "kind": "start" if clean else "restart",
                        "text": "started" if clean else f"restarted after: {previous.get('reason') or 'a failure'}"})
        if isinstance(ended, int | float) and since <= ended <= until:
            stopped = run.get("requested") or (run.get("exit_code") == 0 and not run.get("forced"))
            out.append({"at": iso(ended), "kind": "stop" if stopped else "failure",
                        "text": (run.get("reason") or "stopped") if stopped else
                        f"driver ended: {run.get('reason') or 'exit ' + str(run.get('exit_code'))}"})
        previous = run
    history = History(layout.history_file)  # an adaptive stream's choices of mode, with the rate each was based on
    decided = history.series(since, until, tier=history.tier_for(since, until), metrics=["continuous", "arrival_rate"])
    rates = {p.at: p.last for p in decided.get((STREAM, "arrival_rate"), [])}
    for p in decided.get((STREAM, "continuous"), []):
        mode = "continuous" if p.last else "scheduled"
        rate = f" ({rates[p.at]:g} records/s)" if p.at in rates else ""
        out.append({"at": iso(p.at), "kind": mode, "text": f"adaptive: runs {mode}{rate}"})
    for run in read_ledger(layout.quality_dir).get("runs", []):
        at = epoch_seconds(run.get("at"))
        if at is not None and since <= at <= until:
            out.append({"at": run["at"], "kind": "validation" if run.get("ok") else "validation failed",
                        "text": f"validated {run.get('units', 0)} unit(s), {run.get('failed', 0)} failed"
                                + (f" (backfill {run['backfill']})" if run.get("backfill") else "")
                                + (f" again as of run {run['again']}: "
                                   + ("the same answer" if run.get("same") else "a DIFFERENT answer")
                                   if run.get("again") else "")})
    return sorted(out, key=lambda m: m["at"])


def quality_of(layout: Layout, output: str) -> dict[str, Any] | None:
    """An output's latest data-quality result from the ledger: its last validated unit and the
    counts of units passed and failed; None if nothing was validated yet."""
    entry = (read_ledger(layout.quality_dir).get("outputs") or {}).get(output) or {}
    units = list((entry.get("units") or {}).values())
    pruned = entry.get("pruned") or {}
    if not units and not any(pruned.values()):
        return None
    last = max(units, key=lambda u: u.get("validated_at") or "", default=None)
    return {"passed": sum(u.get("status") == "passed" for u in units) + pruned.get("passed", 0),
            "failed": sum(u.get("status") == "failed" for u in units) + pruned.get("failed", 0),
            "last": None if last is None else {k: last.get(k) for k in ("unit", "status", "validated_at", "docs")}}


def flow(plan: StreamPlan, layout: Layout, health: dict[str, Any], range_key: str = DEFAULT_RANGE,
         now: float | None = None) -> dict[str, Any]:
    """The stream's flow graph over the range: nodes (landing directory, ingestion, accepted
    rows, quarantine, dropped rows, each output and its sink) with their rows in and out, status
    and latest data-quality result, and links carrying the rows that flowed between them."""
    seconds = range_seconds(range_key)
    now = time.time() if now is None else now
    totals = History(layout.history_file).totals(now - seconds, now)
    committed = health.get("last_committed") or {}
    nodes: list[dict[str, Any]] = []
    links: list[dict[str, Any]] = []

    def total(query: str, metric: str) -> int:
        return int(totals.get((query, metric), 0))

    def node(key: str, label: str, detail: str, status: str = "", url: str | None = None) -> int:
        nodes.append({"key": key, "label": label, "detail": detail, "status": status, "url": url,
                      "rows_in": 0, "rows_out": 0})
        return len(nodes) - 1

    def link(source: int, target: int, rows: int, what: str) -> None:
        nodes[source]["rows_out"] += rows
        nodes[target]["rows_in"] += rows
        links.append({"source": source, "target": target, "value": rows, "label": what})

    def batch_of(query: str) -> str:
        batch = committed.get(query)
        return "no batch committed" if batch is None else f"last committed batch {batch}"

    status = str(health.get("status", "unknown"))
    if plan.ingestion is not None:
        source = plan.source
        assert source is not None  # a stream with an ingestion reads a source
        if source.kafka is not None:
            behind = health.get("backlog_records")
            landing = node("landing", "Kafka", f"topics {source.kafka.subscription}; "
                                               f"{behind if behind is not None else '?'} record(s) behind")
        else:
            where = source.landing if source.is_files else f"{source.kind} source"
            backlog = health.get("backlog_files")
            landing = node("landing", "landing", f"{where}; {backlog if backlog is not None else '?'} file(s) waiting")
        ingest = node("ingestion", "ingestion", f"{status}: {health.get('reason', '')}; {batch_of(INGEST_FLOW)}; "
                      f"{_accounting(layout)}", status, url="#charts")
        kind = "Delta table" if plan.ingestion.accepted_is_delta else "Parquet"
        by = ", by event date" if plan.ingestion.partition_by else ""
        accepted = node("accepted", "accepted rows", f"{plan.accepted_path} ({kind}{by})", status)
        link(landing, ingest, total(INGEST_FLOW, "input_rows"), "rows read")
        link(ingest, accepted, total(INGEST_FLOW, "accepted"), "accepted")
        if plan.ingestion.quarantine is not None:
            link(ingest, node("quarantine", "quarantine", plan.ingestion.quarantine),
                 total(INGEST_FLOW, "quarantined"), "malformed or invalid")
        link(ingest, node("duplicates", "duplicates", "dropped by the deduplication"),
             total(INGEST_FLOW, "duplicates"), "duplicates")
        link(ingest, node("late", "dropped late", "behind the watermark"), total(INGEST_FLOW, "late"), "late")
        for output in plan.outputs:
            served = output.written_by_ingestion
            rows_in = total(INGEST_FLOW, "accepted") if served else total(output.name, "input_rows")
            o = node(f"output:{output.name}", output.name,
                     "written by the ingestion: its sink is the accepted-rows table" if served else
                     f"{output.mode} output; {batch_of(output.name)}",
                     status if served or committed.get(output.name) is not None else "starting")
            link(accepted, o, rows_in, "accepted rows read")
            written = total(output.name, "sink_rows")
            sink = _sink_node(node, layout, output)
            link(o, sink, rows_in if served or not written else written, "rows written" if written else "rows")
    else:  # an application of the user's own: its queries, as Spark reports them
        app = node("application", plan.stream, f"{status}: {health.get('reason', '')}", status, url="#charts")
        for query in plan.flows:
            link(app, node(f"output:{query}", query, batch_of(query)), total(query, "input_rows"), "rows read")
    return {"stream": plan.stream, "range": range_key, "nodes": nodes, "links": links}


def _accounting(layout: Layout) -> str:
    """The ingestion's latest data-quality result: whether the last validation found every input
    row accounted for."""
    runs = [r for r in read_ledger(layout.quality_dir).get("runs", []) if isinstance(r.get("accounting"), dict)]
    if not runs:
        return "accounting not checked yet"
    last = runs[-1]
    return f"accounting {'balances' if last['accounting'].get('ok') else 'FAILS'} (validation of {last.get('at')})"


def _sink_node(node: Callable[..., int], layout: Layout, output: OutputPlan) -> int:
    """An output's sink, with its latest data-quality result (``layout``: where its ledger is)."""
    sink = output.sink
    where = (sink.path if isinstance(sink, ParquetDataset) else
             f"Delta table {sink.path}" if isinstance(sink, DeltaDataset) else
             f"table {sink.table}" if isinstance(sink, TableDataset) else f"{sink.kind} sink (not kept)")
    quality = quality_of(layout, output.name)
    if quality is None:
        detail, status = f"{where}; not validated yet", ""
    else:
        last = quality["last"] or {}
        detail = (f"{where}; {quality['passed']} unit(s) passed, {quality['failed']} failed; last: "
                  f"{last.get('unit')} {last.get('status')} at {last.get('validated_at')}")
        status = "failed" if last.get("status") == "failed" else "passed"
    return node(f"sink:{output.name}", f"{output.name} sink", detail, status, url="quality/")


def trend(plan: StreamPlan, layout: Layout, now: float | None = None) -> dict[str, Any]:
    """The overview's small trend: processed rows per second and files waiting, last 15 minutes."""
    now = time.time() if now is None else now
    data = History(layout.history_file).series(now - TREND_SECONDS, now)
    queries = _queries(data)
    first = INGEST_FLOW if INGEST_FLOW in queries else (queries[0] if queries else None)
    processed = _trace("processed rows/s", data.get((first, "processed_rps"), []) if first else [],
                       lambda p: p.mean)
    if plan.source is not None and plan.source.kafka is not None:
        backlog = _trace("records behind", data.get((STREAM, "backlog_records"), []), lambda p: p.max, yaxis="y2")
    else:
        backlog = _trace("files waiting", data.get((STREAM, "backlog_files"), []), lambda p: p.max, yaxis="y2")
    return {"stream": plan.stream, "since": iso(now - TREND_SECONDS), "until": iso(now), "traces": [processed, backlog]}


#: how far back a table's history is read for its last compaction and vacuum
HISTORY_SCANNED = 1000


def delta_tables(plan: StreamPlan) -> list[dict[str, Any]]:
    """Per Delta table of the stream (a Delta accepted-rows table, its Delta sinks): files,
    bytes and version of its newest version, its last compaction and vacuum. Read with the
    ``deltalake`` library, no JVM."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    tables = []
    for name, path in plan.delta_tables.items():
        # every entry has every key, so that a page never meets a missing one
        entry: dict[str, Any] = {"output": name, "path": path, "note": None, "files": None, "bytes": None,
                                 "version": None, "compacted": None, "vacuumed": None}
        try:
            table = DeltaTable(path)
        except TableNotFoundError:
            tables.append(entry | {"note": "no table yet"})
            continue
        adds = table.get_add_actions(flatten=False)
        history = table.history(limit=HISTORY_SCANNED)
        tables.append(entry | {"files": adds.num_rows, "bytes": sum(adds.column("size_bytes").to_pylist()),
                               "version": table.version(), "compacted": _last(history, "OPTIMIZE"),
                               "vacuumed": _last(history, "VACUUM END")})
    return tables


def _last(history: list[dict[str, Any]], operation: str) -> str | None:
    """When the newest commit of ``operation`` in a table's history (newest first) was made."""
    stamp = next((h["timestamp"] for h in history if h.get("operation") == operation), None)
    return iso(stamp / 1000) if stamp is not None else None


def state(layout: Layout, last_committed: dict[str, int | None]) -> dict[str, Any] | None:
    """What the stream's state held when it was last read (``spark_jobs.state``, the stream's
    ``_state`` DAG), per flow and stateful operator, with how many batches each flow has committed
    since (``last_committed``: the health's); None if it was never read."""
    try:
        found = json.loads(layout.state_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    flows = []
    for name, flow in sorted((found.get("flows") or {}).items(), key=lambda f: (f[0] != INGEST_FLOW, f[0])):
        now = last_committed.get(name)
        flows.append({"flow": _label(name), "batch": flow.get("batch"), "watermark": flow.get("watermark"),
                      "bytes": flow.get("bytes"), "operators": flow.get("operators") or [],
                      "since": None if now is None or flow.get("batch") is None else now - flow["batch"]})
    return {"inspected_at": found.get("inspected_at"), "flows": flows}


#: the plans a stream's page lists (newest first)
PLANS_SHOWN = 10


def plans(plan: StreamPlan, layout: Layout) -> dict[str, Any]:
    """The plans the stream started with (``_control/plans/``, newest first) and, if its spec has
    changed since the last, each flow's verdict on the change (``spark_jobs.changes``): what a
    driver would do with the spec as it is now, before anything runs."""
    from spark_jobs import changes
    from spark_jobs.runtime.checkpoint import previous_plan

    started = [p | {"at": iso(p["started_at"]) if isinstance(p.get("started_at"), int | float) else None}
               for p in changes.plans(layout)[:PLANS_SHOWN]]
    previous = previous_plan(layout)
    pending: list[dict[str, Any]] = []
    if previous:
        event_time = plan.ingestion.event_time if plan.ingestion is not None else None
        verdicts = changes.judge(plan, previous, str(layout.spec_dir / f"{plan.stream}.yaml"),
                                 event_time.watermark if event_time else None)
        if any(v.verdict != changes.UNCHANGED for v in verdicts):
            pending = [{"flow": _label(v.flow), "verdict": v.verdict, "runnable": v.runnable, "reasons": v.reasons}
                       for v in verdicts]
    from spark_jobs import upgrade

    upgrades = []
    for record in upgrade.history(layout)[:PLANS_SHOWN]:
        upgrades.append({"number": record.get("number"), "phase": record.get("phase"),
                         "rebuild": record.get("rebuild") or [], "online": bool(record.get("online")),
                         "started": iso(record["started_at"]) if record.get("started_at") else None,
                         "finished": iso(record["finished_at"]) if record.get("finished_at") else None})
    pinned = upgrade.pin_file(layout).exists()
    return {"started": started, "pending": pending, "upgrades": upgrades, "pinned": pinned}

