"""Expected results of a stream's queries, computed in plain Python from generated records.

``expected(plan, records)`` models what a correct exactly-once run of a stream (its compiled
plan, ``spark_jobs.plan.compile_plan``) produces once every file has been processed:

    parse -> malformed records, rows with a null required column and rows whose event
             time lies more than event_time.max_future ahead of ``now`` go to quarantine
          -> watermark on the event time -> dropDuplicatesWithinWatermark(deduplicate.key)
          -> join with each reference file on its key (as spark_jobs.flows.ingestion does; for
             left joins the order makes no difference)
          -> each output's query

``counts`` accounts for every record: ``input_records = accepted + quarantined +
duplicates + dropped_late + unjoined + undecided`` (``unjoined``: dropped by an inner join,
so 0 for left joins; ``undecided``: ``late_edge`` records without a decision). Late events are dropped by the deduplication's watermark filter.
``quarantine`` lists every quarantined record (file number and name, line, reason and
text) so that the quarantine can be compared by content, not only by count.

Spark's watermark depends on how files are grouped into micro-batches. That grouping is
not known here, so only the bounds that hold for every grouping are used. With ``M``
files per trigger and a watermark delay ``D``, the batch that reads file ``k`` evicts
state with a watermark between ``maxts(k - M) - D`` and ``maxts(k - 1) - D``; but it
drops rows as late by the *previous* batch's watermark, which is only known to lie
between ``maxts(k - 2M) - D`` and ``maxts(k - 1) - D`` (see
:meth:`FileHistory.watermark_bounds`). A row (or window) between the bounds has no
predictable fate and raises :class:`GroundTruthError`; the generator never makes one,
except as a record of kind ``late_edge``, made on purpose between the bounds. Its fate is
the ingestion's decision, given as ``decided`` (its deduplication key -> accepted or not,
read by the verifier from the accepted rows); without one it is counted as ``undecided``
and left out. An output may drop an accepted ``late_edge`` row from a window whose end
lies below the highest bound (its own watermark may have closed that window first): such
windows are listed as ``uncertain`` and not compared.

Spark measures ``max_future`` from the processing time, which is later than the
``now`` given here (when the records were written). The generator puts records of kind
``future`` so far ahead that the difference does not matter. A record marked with
another kind (``ok``, ...) that is more than ``max_future`` ahead of ``now`` raises
:class:`GroundTruthError`, as does a ``future`` record that is not; a record without
a kind is quarantined if it is that far ahead.

Records are ledger entries (see :mod:`runner.testdata.generate`)::

    {"file": 3, "line": 7, "kind": "ok", "event": {"event_id": "...", "ts": "2026-...Z", ...}}
    {"file": 3, "line": 8, "kind": "malformed", "reason": "wrong_type", "raw": "..."}

Timestamps are ISO-8601 UTC strings with milliseconds on both sides.
"""

from __future__ import annotations

import bisect
import csv
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from spark_jobs.plan import EventTimePlan, JoinPlan, OutputPlan, StreamPlan
from spark_jobs.runtime import clock
from spark_jobs.stream_spec.models import (
    CODE_QUERIES,
    EVENT_DATE_COLUMN,
    WINDOW_END,
    WINDOW_START,
    Aggregate,
    Aggregation,
    Passthrough,
    Window,
    duration_seconds,
)

LATE_EDGE = "late_edge"
VALID_KINDS = ("ok", "late_within", "late_beyond", LATE_EDGE, "duplicate")
MALFORMED = "malformed"
FUTURE = "future"


class GroundTruthError(ValueError):
    """The records do not determine a single correct result."""


# ---- time helpers -------------------------------------------------------------------------


def parse_ts(text: str) -> int:
    """ISO-8601 timestamp (naive means UTC) -> epoch milliseconds."""
    return clock.to_ms(clock.parse_iso(text))


def format_ts(ms: int) -> str:
    """Epoch milliseconds -> ``2026-01-01T00:00:01.123Z``."""
    return clock.iso_ms(clock.from_ms(ms))


def format_date(ms: int) -> str:
    """Epoch milliseconds -> the UTC date, ``2026-01-01``."""
    return clock.from_ms(ms).date().isoformat()


def seconds_ms(text: str) -> int:
    return round(duration_seconds(text) * 1000)


def event_time(plan: StreamPlan) -> EventTimePlan | None:
    """The stream's event time as its ingestion applies it (None: none, or no ingestion)."""
    return plan.ingestion.event_time if plan.ingestion is not None else None


def deduplication_key(plan: StreamPlan) -> list[str] | None:
    """The ingestion's deduplication key (None: no deduplication)."""
    return plan.ingestion.deduplicate if plan.ingestion is not None else None


def joins(plan: StreamPlan) -> list[JoinPlan]:
    """The ingestion's joins with reference data, in order."""
    return list(plan.ingestion.joins) if plan.ingestion is not None else []


def input_types(plan: StreamPlan) -> dict[str, str]:
    """The source's declared columns: name -> spec type."""
    return {c.name: c.type for c in plan.source.columns} if plan.source is not None else {}


def accepted_types(plan: StreamPlan) -> dict[str, str]:
    """The accepted rows' columns without a transform (the source's, the reference data's, then
    ``event_date`` with event time): name -> spec type."""
    types = input_types(plan)
    for join in joins(plan):
        for c in join.columns:
            types.setdefault(c.name, c.type)
    if event_time(plan) is not None:
        types[EVENT_DATE_COLUMN] = "date"
    return types


def watermark_delay_ms(plan: StreamPlan) -> int:
    """``D``: the event-time watermark delay in milliseconds, 0 without event time."""
    et = event_time(plan)
    return seconds_ms(et.watermark) if et else 0


def max_future_ms(plan: StreamPlan) -> int | None:
    """How far ahead of the processing time an event may be (None: no limit, no file source)."""
    et = event_time(plan)
    if et is None or plan.source is None or not plan.source.is_files:
        return None
    return seconds_ms(et.max_future)


def max_window_ms(plan: StreamPlan) -> int:
    """``W``: the longest window duration among the stream's outputs, 0 if none."""
    lengths = [seconds_ms(o.query.window.duration) for o in plan.outputs
               if isinstance(o.query, Aggregation) and o.query.window is not None]
    return max(lengths, default=0)


#: files per micro-batch without a bound: a Kafka stream's batch takes every record produced
#: since the last one, however many of the generator's files (transactions) they came in
UNBOUNDED = 10**9


def files_per_trigger(plan: StreamPlan) -> int:
    """How many of the generator's files one micro-batch can take at most."""
    source = plan.source
    if source is not None and source.is_files and source.max_files_per_trigger is not None:
        return source.max_files_per_trigger
    return UNBOUNDED if source is not None and source.kind == "kafka" else 1


def windows_for(ts_ms: int, window: Window) -> list[tuple[int, int]]:
    """Every epoch-aligned window ``[start, end)`` (milliseconds) that contains ``ts_ms``."""
    duration = seconds_ms(window.duration)
    slide = seconds_ms(window.slide) if window.slide else duration
    last_start = ts_ms - ts_ms % slide
    starts = range(last_start, ts_ms - duration, -slide)
    return sorted((s, s + duration) for s in starts)


class FileHistory:
    """Per-file maximum event time, and which files hold records at all.

    ``max_ts`` maps a file's sequence number to the largest event time of its rows that
    reach the watermark (``None`` if it has none); ``nonempty`` holds every file with at
    least one record (malformed ones too, as Spark reads them).
    """

    def __init__(self, max_ts: Mapping[int, int | None], nonempty: Iterable[int]):
        self._seqs: list[int] = []
        self._cummax: list[int] = []
        best: int | None = None
        for seq in sorted(max_ts):
            value = max_ts[seq]
            if value is None:
                continue
            best = value if best is None else max(best, value)
            self._seqs.append(seq)
            self._cummax.append(best)
        self._nonempty = sorted(set(nonempty))

    def maxts(self, k: int) -> int | None:
        """Largest event time in files ``1..k``."""
        i = bisect.bisect_right(self._seqs, k)
        return self._cummax[i - 1] if i else None

    def floor(self, k: int, n: int) -> int:
        """The oldest of the last ``n`` non-empty files up to file ``k`` (1 if there are fewer).

        File ``k`` counts as non-empty (it holds the record in question). Counting only
        non-empty files is never later than ``k - n + 1``, so the bounds built on it also
        hold if Spark does not count empty files towards ``maxFilesPerTrigger``.
        """
        i = bisect.bisect_right(self._nonempty, k)
        has_k = i > 0 and self._nonempty[i - 1] == k
        length = i if has_k else i + 1
        if length < n:
            return 1
        pos = length - n
        return self._nonempty[pos] if pos < i else k

    def watermark_bounds(self, k: int, m: int, delay_ms: int) -> tuple[int | None, int | None]:
        """(lowest, highest) watermark that can judge file ``k``'s rows late; None = none yet.

        Spark drops a row as late when its event time is at or below the watermark of the
        micro-batch *before* the one that reads it (``getInputWatermarkForLateEvents``
        uses ``batchId - 1`` since Spark 3.5). That watermark comes from the batches two
        or more before: the lowest it can be is ``maxts(k - 2m) - D``, the highest
        ``maxts(k - 1) - D``.
        """
        floor = self.floor(k, 2 * m)
        low = self.maxts(floor - 1) if floor > 1 else None
        high = self.maxts(k - 1)
        return (None if low is None else low - delay_ms, None if high is None else high - delay_ms)


# ---- reference data -----------------------------------------------------------------------


def convert(value: Any, type_: str, *, empty_is_null: bool = False) -> Any:
    """A JSON/CSV value -> the internal value: timestamps as epoch ms, dates as ISO strings.

    ``empty_is_null`` reads an empty field as null, as Spark's CSV reader does.
    """
    if value is None or (value == "" and (empty_is_null or type_ != "string")):
        return None
    if type_ == "timestamp":
        return parse_ts(value) if isinstance(value, str) else int(value)
    if type_ in ("integer", "long"):
        return int(value)
    if type_ == "double":
        return float(value)
    if type_ == "boolean":
        return value if isinstance(value, bool) else str(value).lower() == "true"
    return str(value)


def load_reference(join: JoinPlan) -> list[dict[str, Any]]:
    """Rows of a join's reference file (its path resolved in the plan), typed by its columns."""
    path = Path(join.path)
    types = {c.name: c.type for c in join.columns}
    if join.format == "csv":
        with path.open(newline="", encoding="utf-8") as fh:
            raw = list(csv.DictReader(fh))
    elif join.format == "json":
        files = sorted(path.glob("*.json")) if path.is_dir() else [path]
        raw = [json.loads(line) for f in files for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        import pyarrow.parquet as pq  # only needed for parquet reference data

        raw = pq.read_table(path).to_pylist()
    csv_like = join.format == "csv"
    return [{name: convert(row.get(name), t, empty_is_null=csv_like) for name, t in types.items()} for row in raw]


def reference_keys(join: JoinPlan) -> list[tuple]:
    """The distinct key tuples of a join's reference file, in file order."""
    keys = (tuple(row[k] for k in join.key) for row in load_reference(join))
    return list(dict.fromkeys(keys))


# ---- the model ----------------------------------------------------------------------------


def _sort_key(row: Mapping[str, Any], columns: list[str]) -> tuple:
    return tuple((0, "") if row.get(c) is None else (1, row[c]) for c in columns)


def _classify(ts: int, bounds: tuple[int | None, int | None]) -> bool:
    """True if ``ts`` is late (dropped) for every micro-batch grouping, False if never late."""
    low, high = bounds
    if low is not None and ts <= low:
        return True
    if high is None or ts > high:
        return False
    raise GroundTruthError(f"event time {format_ts(ts)} is between the watermark bounds "
                           f"({format_ts(low) if low is not None else '-'}, {format_ts(high)}]: "
                           "whether Spark drops it depends on micro-batch boundaries")


def _check_kind(record: Mapping[str, Any], outcome: str) -> None:
    """A record's declared kind must agree with what the model decided."""
    kind = record.get("kind")
    if kind is None:
        return
    expected = {"late_beyond": "late", "duplicate": "duplicate", "ok": "accepted", "late_within": "accepted"}
    if kind in expected and expected[kind] != outcome:
        raise GroundTruthError(f"record file={record.get('file')} line={record.get('line')} is marked {kind!r} "
                               f"but would be {outcome}")


def _aggregate(agg: Aggregate, rows: list[dict[str, Any]], types: Mapping[str, str], event_col: str | None) -> Any:
    if agg.fn == "count":
        return len(rows) if agg.column is None else sum(r.get(agg.column) is not None for r in rows)
    values = [r.get(agg.column) for r in rows]
    present = [v for v in values if v is not None]
    type_ = types[agg.column]
    if agg.fn == "approx_count_distinct":
        return len(set(present))
    if agg.fn == "latest":
        if not rows:
            return None
        newest = max(r[event_col] for r in rows)
        at_max = {json.dumps(r.get(agg.column)) for r in rows if r[event_col] == newest}
        if len(at_max) > 1:
            raise GroundTruthError(f"latest({agg.column}) is ambiguous: several values at {format_ts(newest)}")
        return _out(next(r.get(agg.column) for r in rows if r[event_col] == newest), type_)
    if not present:
        return None
    if agg.fn == "sum":
        return int(sum(present)) if type_ in ("integer", "long") else float(sum(present))
    if agg.fn == "avg":
        return float(sum(present)) / len(present)
    if agg.fn == "min":
        return _out(min(present), type_)
    return _out(max(present), type_)


def _out(value: Any, type_: str) -> Any:
    if value is not None and type_ == "timestamp":
        return format_ts(value)
    return value


def expected(plan: StreamPlan, records: Iterable[Mapping[str, Any]], *,
             files: int | None = None, settings: Any = None, now_ms: int | None = None,
             decided: Mapping[tuple, bool] | None = None) -> dict[str, Any]:
    """What every output of the stream (its compiled ``plan``) holds after all records have been
    processed exactly once.

    ``decided``: the ingestion's decision on each ``late_edge`` record, by deduplication key
    (True: accepted); see the module's note.

    ``files`` (the number of files written) and ``settings`` (how they were generated)
    are copied into the result; ``files`` defaults to the highest file number seen.
    ``now_ms`` is when the records were written (default: now), the earliest time Spark
    can read them, for ``event_time.max_future``.
    """
    records = sorted(records, key=lambda r: (r.get("file", 0), r.get("line", 0)))
    inputs = input_types(plan)
    types = accepted_types(plan)
    required = [c.name for c in plan.source.columns if c.required] if plan.source is not None else []
    et = event_time(plan)
    event_col = et.column if et else None
    dedup_key = deduplication_key(plan)
    delay = watermark_delay_ms(plan)
    m = files_per_trigger(plan)
    references = []
    for join in joins(plan):
        index: dict[tuple, list[dict[str, Any]]] = {}
        for row in load_reference(join):
            index.setdefault(tuple(row[k] for k in join.key), []).append(row)
        references.append((join, index))

    ahead = max_future_ms(plan)
    future_limit = None if ahead is None else (clock.now_ms() if now_ms is None else now_ms) + ahead

    counts = {"input_records": len(records), "quarantined": 0, "unjoined": 0,
              "duplicates": 0, "dropped_late": 0, "accepted": 0, "undecided": 0}

    # parse and quarantine
    valid: list[tuple[Mapping[str, Any], dict[str, Any]]] = []
    quarantine: list[dict[str, Any]] = []
    csv_like = plan.source is not None and plan.source.is_files and plan.source.format == "csv"
    for rec in records:
        if rec.get("kind") == MALFORMED or "event" not in rec:
            quarantine.append(_quarantined(rec, rec.get("reason"), inputs, csv_like))
            continue
        event = {name: convert(rec["event"].get(name), t) for name, t in inputs.items()}
        if any(event[c] is None for c in required):
            quarantine.append(_quarantined(rec, "missing_required", inputs, csv_like))
            continue
        if _too_far_ahead(rec, event, event_col, future_limit):
            quarantine.append(_quarantined(rec, FUTURE, inputs, csv_like))
            continue
        valid.append((rec, event))
    counts["quarantined"] = len(quarantine)

    # watermark and deduplication, then the joins
    history = FileHistory(_file_max(valid, event_col), {r.get("file", 0) for r in records})
    max_event = max((ev[event_col] for _, ev in valid), default=None) if event_col else None
    final_watermark = None if max_event is None else max_event - delay
    kept: dict[tuple, int | None] = {}
    bounds_by_file: dict[int, tuple[int | None, int | None]] = {}
    accepted: list[tuple[int, dict[str, Any], tuple[int | None, int | None], bool]] = []
    for rec, event in valid:
        file_no = rec.get("file", 0)
        if file_no not in bounds_by_file:
            bounds_by_file[file_no] = history.watermark_bounds(file_no, m, delay) if event_col else (None, None)
        bounds = bounds_by_file[file_no]
        if dedup_key is not None:
            assert event_col is not None  # the spec rules demand event time for deduplication
            edge = rec.get("kind") == LATE_EDGE
            if edge:
                key = tuple(event[k] for k in dedup_key)
                if decided is None or key not in decided:
                    counts["undecided"] += 1
                    continue
                if not decided[key]:
                    counts["dropped_late"] += 1
                    continue
            elif _classify(event[event_col], bounds):
                _check_kind(rec, "late")
                counts["dropped_late"] += 1
                continue
            key = tuple(event[k] for k in dedup_key)
            if key in kept:
                first = kept[key]
                high = bounds[1]
                if high is not None and first + delay <= high:
                    raise GroundTruthError(f"key {key} repeats after its first occurrence may have left the state")
                _check_kind(rec, "duplicate")
                counts["duplicates"] += 1
                continue
            kept[key] = event[event_col]
        _check_kind(rec, "accepted")
        rows = _join(event, references)
        if not rows:
            counts["unjoined"] += 1  # only an inner join drops rows
            continue
        if event_col is not None:
            for r in rows:
                r[EVENT_DATE_COLUMN] = format_date(event[event_col])
        counts["accepted"] += 1
        accepted.extend((file_no, r, bounds, rec.get("kind") == LATE_EDGE) for r in rows)

    # a SQL or Python query's result, or a transform's, is Spark's to compute; the ground truth
    # models the spec's own query types over the accepted rows (verify.agreement checks the rest)
    transform = plan.ingestion.transform if plan.ingestion is not None else None
    outputs = {o.name: _output(o, accepted, types, event_col, final_watermark) for o in plan.outputs
               if not isinstance(o.query, CODE_QUERIES) and transform is None}
    return {
        "stream": plan.stream,
        "files": files if files is not None else max((r.get("file", 0) for r in records), default=0),
        "ledger_records": len(records),
        "settings": settings,
        "max_files_per_trigger": None if m == UNBOUNDED else m,
        "watermark": {
            "delay_seconds": delay / 1000,
            "max_event_time": None if max_event is None else format_ts(max_event),
            "final": None if final_watermark is None else format_ts(final_watermark),
        },
        "counts": counts,
        "outputs": outputs,
        "quarantine": quarantine,
    }


def _quarantined(record: Mapping[str, Any], reason: str | None, input_types: Mapping[str, str],
                 csv_like: bool) -> dict[str, Any]:
    """What the quarantine holds for a record: its file, its text and why.

    ``raw`` is the record's text as written (the ledger's ``raw``); a record written from
    its event alone (one too far in the future) gets the event's non-null input columns
    as a JSON object, the form in which the quarantine keeps a record it could parse.
    """
    raw = record.get("raw")
    if raw is None and isinstance(record.get("event"), Mapping):
        event = record["event"]
        raw = json.dumps({c: event[c] for c in input_types
                          if event.get(c) is not None and not (csv_like and event[c] == "")})
    return {"file": record.get("file"), "name": record.get("name"), "line": record.get("line"),
            "reason": reason, "raw": raw}


def _too_far_ahead(record: Mapping[str, Any], event: Mapping[str, Any], event_col: str | None,
                   limit: int | None) -> bool:
    """True if Spark quarantines the record as too far in the future; its kind must agree."""
    ts = event[event_col] if event_col is not None and limit is not None else None
    ahead = ts is not None and ts > limit
    kind = record.get("kind")
    where = f"record file={record.get('file')} line={record.get('line')}"
    if kind == FUTURE and not ahead:
        raise GroundTruthError(f"{where} is marked 'future' but its event time is not beyond event_time.max_future")
    if ahead and kind not in (None, FUTURE):
        raise GroundTruthError(f"{where} is marked {kind!r} but its event time {format_ts(ts)} is more than "
                               f"event_time.max_future ahead of the time it was written, so Spark quarantines "
                               "it; start the clock earlier or widen max_future")
    return ahead


def _file_max(valid, event_col: str | None) -> dict[int, int | None]:
    out: dict[int, int | None] = {}
    for rec, event in valid:
        f = rec.get("file", 0)
        ts = event[event_col] if event_col else None
        if ts is not None:
            out[f] = ts if out.get(f) is None else max(out[f], ts)
    return out


def _join(event: dict[str, Any], references) -> list[dict[str, Any]]:
    """The event joined with each reference file: one row per match, nulls for none (left join)."""
    rows = [dict(event)]
    for e, index in references:
        extra = [c.name for c in e.columns if c.name not in e.key and c.name not in rows[0]]
        matches = index.get(tuple(event[k] for k in e.key))
        if matches is None:
            if e.how == "inner":
                return []
            matches = [dict.fromkeys(extra)]
        rows = [{**r, **{c: mrow.get(c) for c in extra}} for r in rows for mrow in matches]
    return rows


def _output(output: OutputPlan, accepted, types: Mapping[str, str],
            event_col: str | None, final_watermark: int | None) -> dict[str, Any]:
    q = output.query
    columns = output.columns
    assert columns is not None  # known without Spark: no transform, no SQL or Python query
    key = list(output.key)
    if isinstance(q, Passthrough):
        rows = [{c: _out(r.get(c), types.get(c, "string")) for c in columns} for _, r, _, _ in accepted]
        rows.sort(key=lambda r: (_sort_key(r, key), json.dumps(r, sort_keys=True, default=str)))
        return {"kind": "rows", "mode": output.mode, "key": key, "approximate": [], "columns": columns, "rows": rows,
                "uncertain": []}

    assert isinstance(q, Aggregation)
    groups: dict[tuple, list[dict[str, Any]]] = {}
    uncertain: set[tuple] = set()
    for _, row, bounds, edge in accepted:
        group = tuple(row.get(c) for c in q.group_by)
        if q.window is None:
            groups.setdefault(group, []).append(row)
            continue
        for start, end in windows_for(row[event_col], q.window):
            if edge and bounds[1] is not None and end <= bounds[1]:
                uncertain.add((start, end, *group))  # the output's watermark may have closed it first
            # a window whose end is at or below the watermark no longer takes rows
            elif _classify(end, bounds):
                continue
            groups.setdefault((start, end, *group), []).append(row)
    result, uncertain_keys = [], []
    for group, rows in groups.items():
        out: dict[str, Any] = {}
        is_uncertain = group in uncertain
        if q.window is not None:
            start, end, *rest = group
            if final_watermark is None or end > final_watermark:
                continue  # append mode emits a window only once the watermark has passed its end
            out[WINDOW_START], out[WINDOW_END] = format_ts(start), format_ts(end)
            group = tuple(rest)
        for c, v in zip(q.group_by, group, strict=True):
            out[c] = _out(v, types.get(c, "string"))
        if is_uncertain:
            uncertain_keys.append([out[c] for c in key])
            continue
        for agg in q.aggregates:
            out[agg.name] = _aggregate(agg, rows, types, event_col)
        result.append(out)
    result.sort(key=lambda r: (_sort_key(r, key), _sort_key(r, columns)))
    approximate = [a.name for a in q.aggregates if a.fn == "approx_count_distinct"]
    return {"kind": "rows", "mode": output.mode, "key": key, "approximate": approximate, "columns": columns,
            "rows": result, "uncertain": sorted(uncertain_keys, key=repr)}


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    """All records of a ledger file (JSON Lines)."""
    p = Path(path)
    if not p.exists():
        return []
    with p.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
