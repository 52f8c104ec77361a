"""The records of one generated file: which kinds, at which event times, with which values, in which encoding.

A file's records are, besides on-time events, late events that Spark must keep (``late_within``)
or drop (``late_beyond``) whatever the micro-batch boundaries; if asked (``late_edge``, default
0), late events so close to the watermark that the micro-batch boundaries decide their fate
(the verifier reads the ingestion's decision from its accepted rows); exact duplicates, events
whose join keys are missing from the reference data, and malformed records; if asked
(``future``, default 0), events dated far beyond ``event_time.max_future`` ahead of now,
which Spark must quarantine before they reach the watermark. Each comes with its ledger
entry (``kind``, ``flags``, ``of`` for a duplicate, ``reason``, ``column`` and ``raw`` for a
malformed record).

On-time event times come from the virtual clock (``clock_ms`` in the generator's state,
``event_interval_ms`` per event) or the wall clock; they are unique and increase strictly,
so "latest" aggregates are well defined. The generator's state carries what the next file
needs: the clock, the recent event times, the previous file's events to duplicate.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runner.testdata import groundtruth as gt
from spark_jobs.plan import input_columns
from spark_jobs.spec.layout import Layout
from spark_jobs.spec.models import (
    Aggregation,
    Column,
    StreamSpec,
)


class GeneratorError(RuntimeError):
    """The generator cannot run as asked; the message says why."""


@dataclass
class Settings:
    """How to generate one run. Shares are fractions of the valid events per file."""

    files: int = 10
    events_per_file: int = 100
    rate: float | None = None  # files per second; None = batch mode
    duration: float | None = None  # seconds; None = until SIGINT/SIGTERM
    late_within: float = 0.03
    late_beyond: float = 0.02
    late_edge: float = 0.0  # late events whose fate the micro-batch boundaries decide (see records.py)
    duplicates: float = 0.02
    malformed: float = 0.03
    unknown_keys: float = 0.02
    future: float = 0.0  # events beyond event_time.max_future ahead of now; Spark quarantines them
    empty_files: int = 1
    seed: int = 7
    start: str | None = None  # virtual clock start; default DEFAULT_START
    event_interval_ms: int = 1000
    clock: str | None = None  # "virtual" or "wall"; default virtual in batch mode, wall in rate mode

    @property
    def mode(self) -> str:
        return "batch" if self.rate is None else "rate"

    @property
    def clock_kind(self) -> str:
        return self.clock or ("virtual" if self.rate is None else "wall")

    def check(self) -> None:
        problems = []
        for name in ("late_within", "late_beyond", "late_edge", "duplicates", "malformed", "unknown_keys", "future"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                problems.append(f"{name} must be between 0 and 1, not {value}")
        if self.late_within + self.late_beyond + self.late_edge + self.duplicates + self.future > 1:
            problems.append("late_within + late_beyond + late_edge + duplicates + future must not exceed 1")
        if self.files < 0 or self.events_per_file < 0 or self.empty_files < 0:
            problems.append("files, events_per_file and empty_files must not be negative")
        if self.rate is not None and not self.rate > 0:
            problems.append("rate must be positive")
        if self.duration is not None and self.duration < 0:
            problems.append("duration must not be negative")
        if self.event_interval_ms < 1:
            problems.append("event_interval_ms must be at least 1")
        if self.clock not in (None, "virtual", "wall"):
            problems.append("clock must be 'virtual' or 'wall'")
        if self.start is not None:
            try:
                gt.parse_ts(self.start)
            except ValueError:
                problems.append(f"start {self.start!r} is not an ISO-8601 timestamp")
        if problems:
            raise GeneratorError("; ".join(problems))


#: Safety distance from the watermark bounds for late events and duplicates.
LATE_MARGIN_MS = 30_000
#: Share of optional columns left null in valid events.
NULL_SHARE = 0.02
#: How much further than ``event_time.max_future`` ahead of now a ``future`` event lies (100 years),
#: so that it is still too far ahead whenever Spark reads it.
FUTURE_LEAD_MS = 36_500 * 86_400_000


# ---- values ---------------------------------------------------------------------------------


def _temperature(rng: random.Random) -> float:
    return round(min(35.0, max(15.0, rng.gauss(24.0, 4.0))), 2)


#: Realistic values for well-known column names (when the type fits); anything else is generated by type.
KNOWN_VALUES: dict[tuple[str, str], Callable[[random.Random], Any]] = {
    ("temperature", "double"): _temperature,
    ("humidity", "double"): lambda rng: round(rng.uniform(0, 100), 1),
    ("status", "string"): lambda rng: rng.choices(["ok", "warn", "fail"], weights=[90, 7, 3])[0],
    ("user_id", "string"): lambda rng: f"user-{rng.randrange(200):04d}",
    ("duration_ms", "long"): lambda rng: int(min(120_000, max(50, rng.lognormvariate(7.5, 1.0)))),
    ("duration_ms", "integer"): lambda rng: int(min(120_000, max(50, rng.lognormvariate(7.5, 1.0)))),
    ("device_id", "string"): lambda rng: f"dev-{rng.randrange(20):03d}",
    ("page", "string"): lambda rng: rng.choice(["/", "/search", "/cart", "/checkout", "/help"]),
}

#: Wrong-typed values: none is a number, a special value ("NaN", "Inf", "now", "today")
#: or a time of day that Spark's parsers might accept.
BAD_VALUES = {
    "double": ["hot", "n/a", "abc"],
    "integer": ["n/a", "abc", "lots"],
    "long": ["n/a", "abc", "lots"],
    "timestamp": ["not-a-time", "n/a", "unknown"],
    "date": ["not-a-date", "n/a"],
    "boolean": ["maybe", "perhaps"],
}
BAD_BYTES = [b"\xff\xfe", b"\xc3\x28", b"\x80"]


def _by_type(col: Column, rng: random.Random) -> Any:
    if col.type == "string":
        return f"{col.name}-{rng.randrange(100)}"
    if col.type == "integer":
        return rng.randrange(1000)
    if col.type == "long":
        return rng.randrange(1_000_000)
    if col.type == "double":
        return round(rng.uniform(0, 100), 3)
    if col.type == "boolean":
        return rng.random() < 0.5
    raise AssertionError(col.type)  # timestamps and dates come from the clock


def _csv_field(value: Any) -> str:
    """A value as Spark's CSV reader expects it (quote ``"``, escape ``\\``, empty = null)."""
    if value is None:
        return ""
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    if any(ch in text for ch in ',"\\\r\n'):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def _unknown_values(name: str, type_: str, known: set[Any]) -> list[Any]:
    """Three values of a key column that the reference data does not hold."""
    out: list[Any] = []
    n = 0
    while len(out) < 3:
        if type_ in ("integer", "long"):
            candidate: Any = max((k for k in known if isinstance(k, int)), default=0) + 1 + n
        elif name == "device_id":
            candidate = f"dev-9{n:02d}"
        elif name == "page":
            candidate = f"/unknown/{n}"
        else:
            candidate = f"unknown-{n}"
        if candidate not in known:
            out.append(candidate)
        n += 1
    return out


# ---- the records of one file ----------------------------------------------------------------


class RecordMaker:
    """Makes the records of one stream's files, from its spec and reference data."""

    def __init__(self, spec: StreamSpec, layout: Layout):
        self.spec = spec
        self.format = spec.source.format
        self.columns = list(spec.source.columns)
        self.event_col = spec.event_time.column if spec.event_time else None
        self.delay = gt.watermark_delay_ms(spec)
        self.max_future = gt.max_future_ms(spec)
        self.window = gt.max_window_ms(spec)
        self.m = gt.files_per_trigger(spec)
        self.margin = min(LATE_MARGIN_MS, self.delay // 4)
        self.key_choices = [(e.key, gt.reference_keys(e, layout)) for e in spec.enrich]
        types = input_columns(spec)
        self.unknown = {}
        for key, known in self.key_choices:
            for i, name in enumerate(key):
                self.unknown.setdefault(name, _unknown_values(name, types[name], {k[i] for k in known}))
        id_cols = {"event_id"}
        if spec.deduplicate and len(spec.deduplicate.key) == 1:
            id_cols.add(spec.deduplicate.key[0])
        self.id_cols = {c for c in id_cols if c in types and types[c] in ("string", "integer", "long")}
        self.never_null = set(self.unknown) | {a.column for o in spec.outputs if isinstance(o.query, Aggregation)
                                               for a in o.query.aggregates if a.fn == "latest"}
        self.malformed_reasons = self._malformed_reasons()

    def make(self, seq: int, state: dict[str, Any], settings: Settings, rng: random.Random,
             now_ms: int, span_ms: float) -> tuple[list[dict], list[bytes], int | None]:
        """The records of file ``seq``: (ledger entries in file order, each record's bytes with its line
        end, max ts reaching the watermark). A CSV file begins with :meth:`header`.

        Moves the clock in ``state`` and leaves there what the next file needs. ``now_ms``: the wall clock;
        ``span_ms``: the stretch of wall-clock time the on-time events of a wall-clock file cover.
        """
        n = settings.events_per_file
        history = self._history(state)
        prev_max = history.maxts(seq - 1)
        has_time = self.event_col is not None
        # the lowest watermark that can judge this file's rows late (None: nothing is late yet)
        lowest_watermark, highest_watermark = (history.watermark_bounds(seq, self.m, self.delay) if has_time
                                               else (None, None))
        # each valid event's kind, by its share; a kind this stream cannot have falls back to on time
        shares = ((gt.LATE_EDGE, settings.late_edge, bool(self.spec.deduplicate) and lowest_watermark is not None),
                  ("late_beyond", settings.late_beyond, lowest_watermark is not None),
                  ("late_within", settings.late_within, has_time and self.delay - self.margin > 2),
                  ("duplicate", settings.duplicates, bool(self.spec.deduplicate)),
                  (gt.FUTURE, settings.future, self.max_future is not None))
        kinds = []
        for _ in range(n):
            u, kind = rng.random(), "ok"
            for name, share, possible in shares:
                if u < share:
                    kind = name if possible else "ok"
                    break
                u -= share
            kinds.append(kind)
        if kinds and "ok" not in kinds:
            kinds[0] = "ok"  # every file with events has an on-time one to copy and to move the clock
        n_ok = kinds.count("ok")

        used = set(state["recent_ts"])
        items: list[tuple[float, int, dict]] = []  # (position, order, entry)
        counter = iter(range(1, 1_000_000))

        def add(pos: float, entry: dict) -> None:
            items.append((pos, len(items), entry))

        # on-time events move the clock
        file_max = None
        ontime: list[tuple[int, dict]] = []
        for i in range(n_ok):
            ts = self._next_ts(state, settings, rng, i, n_ok, now_ms, span_ms)
            unknown = rng.random() < settings.unknown_keys and bool(self.unknown)
            event = self._event(seq, next(counter), ts, rng, unknown)
            used.add(ts)
            file_max = ts if file_max is None else max(file_max, ts)
            entry = {"kind": "ok", "flags": ["unknown_key"] if unknown else [], "event": event}
            ontime.append((ts, entry))
            add(i, entry)
        newest = max((x for x in (prev_max, file_max) if x is not None), default=None)

        # late and duplicate events
        prev = state["prev"] if state["prev"] and state["prev"]["seq"] == seq - 1 else None
        for kind in kinds:
            if kind == "late_within" and newest is not None:
                ts = _free_ts(rng, newest - self.delay + self.margin + 1, newest - 1, used)
                if ts is None:
                    continue
                used.add(ts)
                add(rng.uniform(0, n_ok), {"kind": kind, "flags": [], "event": self._event(seq, next(counter), ts, rng, False)})
            elif kind == "late_beyond":
                assert lowest_watermark is not None
                # below the watermark by more than a window: every window holding it has closed too
                bound = lowest_watermark - self.window - LATE_MARGIN_MS
                ts = bound - 1 - rng.randrange(max(self.delay, 60_000))
                add(rng.uniform(0, n_ok), {"kind": kind, "flags": [], "event": self._event(seq, next(counter), ts, rng, False)})
            elif kind == gt.LATE_EDGE:
                # between the lowest and the highest watermark that can judge this file (and a little
                # below): whether Spark keeps it depends on where the micro-batches begin and end
                assert lowest_watermark is not None and highest_watermark is not None
                below = max(highest_watermark - lowest_watermark, 1000)
                ts = _free_ts(rng, lowest_watermark - below, highest_watermark, used)
                if ts is None:
                    continue
                used.add(ts)
                add(rng.uniform(0, n_ok), {"kind": kind, "flags": [], "event": self._event(seq, next(counter), ts, rng, False)})
            elif kind == gt.FUTURE:
                ts = max(now_ms, state["clock_ms"]) + self.max_future + FUTURE_LEAD_MS + rng.randrange(86_400_000)
                add(rng.uniform(0, n_ok), {"kind": kind, "flags": [], "event": self._event(seq, next(counter), ts, rng, False)})
            elif kind == "duplicate":
                candidates = len(prev["events"]) if prev else 0
                pick = rng.randrange(candidates + n_ok)
                if pick < candidates:
                    line, original = prev["events"][pick]
                    pos, of, flags = rng.uniform(0, n_ok), {"file": seq - 1, "line": line}, original["flags"]
                    event = original["event"]
                else:
                    i = pick - candidates
                    pos, of = rng.uniform(i, n_ok), {"entry": id(ontime[i][1])}
                    event, flags = ontime[i][1]["event"], ontime[i][1]["flags"]
                add(pos, {"kind": kind, "flags": list(flags), "of": of, "event": dict(event)})

        # malformed records
        if self.malformed_reasons:
            for _ in range(sum(rng.random() < settings.malformed for _ in range(n))):
                base_ts = (state["clock_ms"] if newest is None else newest) - rng.randrange(60_000)
                base = self._event(seq, next(counter), base_ts, rng, False)
                add(rng.uniform(0, max(n_ok, 1)), self._malformed(base, rng))

        items.sort(key=lambda x: (x[0], x[1]))
        entries = [e for _, _, e in items]
        first_line = 2 if self.format == "csv" else 1
        lines_by_id = {}
        for i, e in enumerate(entries):
            e["line"] = first_line + i
            lines_by_id[id(e)] = e["line"]
        for e in entries:
            if "entry" in e.get("of", {}):
                e["of"] = {"file": seq, "line": lines_by_id[e["of"]["entry"]]}
        chunks = [e.pop("_raw") if "_raw" in e else self._encode(e["event"]) for e in entries]
        out = [{"line": e.pop("line"), **e} for e in entries]

        # what the next file needs
        if newest is not None:
            state["recent_ts"] = sorted(t for t in used if t >= newest - self.delay)
            eligible = [(e["line"], e) for e in out if e["kind"] == "ok"
                        and gt.parse_ts(e["event"][self.event_col]) > newest - self.delay + self.margin] if has_time else []
            state["prev"] = {"seq": seq, "events": [[line, {"flags": e["flags"], "event": e["event"]}]
                                                    for line, e in eligible[-1000:]]}
        return out, chunks, file_max

    def header(self) -> bytes:
        """What a file begins with before its records: a CSV header line, nothing for JSON."""
        return ",".join(c.name for c in self.columns).encode() + b"\n" if self.format == "csv" else b""

    def _history(self, state: dict[str, Any]) -> gt.FileHistory:
        hist = state["history"]
        return gt.FileHistory({s: ts for s, ts, _ in hist}, [s for s, _, nonempty in hist if nonempty])

    def _next_ts(self, state: dict[str, Any], settings: Settings, rng: random.Random, i: int, n: int,
                 now_ms: int, span_ms: float) -> int:
        """The next on-time event time: strictly increasing, from the virtual or the wall clock."""
        step = settings.event_interval_ms
        last = state["last_ts_ms"]
        if settings.clock_kind == "virtual":
            ts = state["clock_ms"] + (rng.randrange(step) if step > 1 else 0)
            state["clock_ms"] += step
        else:
            ts = now_ms - int(span_ms) + math.floor(span_ms * (i + 1) / n)
        if last is not None:
            ts = max(ts, last + 1)
        state["last_ts_ms"] = ts
        if settings.clock_kind == "wall":
            state["clock_ms"] = max(state["clock_ms"], ts + 1)
        return ts

    def _event(self, seq: int, idx: int, ts: int, rng: random.Random, unknown: bool) -> dict[str, Any]:
        """One valid event, as JSON values (timestamps as ISO strings)."""
        keys: dict[str, Any] = {}
        for key, known in self.key_choices:
            if unknown:
                for name in key:
                    keys.setdefault(name, rng.choice(self.unknown[name]))
            elif known:
                for name, value in zip(key, rng.choice(known), strict=True):
                    keys.setdefault(name, value)
        event: dict[str, Any] = {}
        for col in self.columns:
            if col.name in keys:
                value = keys[col.name]
            elif col.name in self.id_cols:
                value = f"{self.spec.name}-{seq:06d}-{idx:04d}" if col.type == "string" else seq * 1_000_000 + idx
            elif col.type == "timestamp":
                value = gt.format_ts(ts)
            elif col.type == "date":
                value = gt.format_date(ts)
            elif not col.required and col.name not in self.never_null and rng.random() < NULL_SHARE:
                value = None
            elif (col.name, col.type) in KNOWN_VALUES:
                value = KNOWN_VALUES[col.name, col.type](rng)
            else:
                value = _by_type(col, rng)
            if value is not None and col.type == "double":
                value = float(value)
            event[col.name] = value
        return event

    def _encode(self, event: dict[str, Any]) -> bytes:
        if self.format == "json":
            return json.dumps(event).encode() + b"\n"
        return ",".join(_csv_field(event[c.name]) for c in self.columns).encode() + b"\n"

    # ---- malformed records --------------------------------------------------------------------

    def _malformed_reasons(self) -> list[str]:
        typed = [c for c in self.columns if c.type != "string"]
        required = [i for i, c in enumerate(self.columns) if c.required]
        reasons = ["truncated"] if self.format == "json" else []
        if typed:
            reasons.append("wrong_type")
        if self.format == "json":
            reasons += (["missing_required"] if required else []) + ["invalid_utf8"]
        else:
            reasons += (["too_few_fields"] if required and required[-1] >= 1 else [])
            reasons += ["invalid_utf8"] if typed else []
        return reasons

    def _malformed(self, base: dict[str, Any], rng: random.Random) -> dict[str, Any]:
        """A record Spark must quarantine: it cannot be parsed, or lacks a required value."""
        reason = rng.choice(self.malformed_reasons)
        typed = [c for c in self.columns if c.type != "string"]
        column = None
        event = dict(base)
        if reason == "wrong_type":
            col = rng.choice(typed)
            column = col.name
            event[col.name] = "hot" if col.name == "temperature" else rng.choice(BAD_VALUES[col.type])
            raw = self._encode(event)
        elif reason == "truncated":
            text = json.dumps(event)
            raw = text[: rng.randrange(1, len(text) - 1)].encode() + b"\n"
        elif reason == "missing_required":
            col = rng.choice([c for c in self.columns if c.required])
            column = col.name
            if rng.random() < 0.5:
                del event[col.name]
            else:
                event[col.name] = None
            raw = json.dumps(event).encode() + b"\n"
        elif reason == "too_few_fields":
            last_required = max(i for i, c in enumerate(self.columns) if c.required)
            keep = rng.randint(1, last_required)
            column = self.columns[keep].name
            raw = ",".join(_csv_field(event[c.name]) for c in self.columns[:keep]).encode() + b"\n"
        elif self.format == "json":  # invalid_utf8 between tokens
            raw = b"{" + rng.choice(BAD_BYTES) + json.dumps(event).encode()[1:] + b"\n"
        else:  # invalid_utf8 inside a numeric or timestamp field
            col = rng.choice(typed)
            column = col.name
            fields = [_csv_field(event[c.name]).encode() for c in self.columns]
            i = self.columns.index(col)
            text = fields[i] or b"0"
            cut = rng.randint(1, max(1, len(text) - 1))
            fields[i] = text[:cut] + rng.choice(BAD_BYTES) + text[cut:]
            raw = b",".join(fields) + b"\n"
        entry = {"kind": "malformed", "reason": reason, "raw": raw.rstrip(b"\n").decode("utf-8", "backslashreplace"),
                 "_raw": raw}
        if column:
            entry["column"] = column
        return entry



def _free_ts(rng: random.Random, low: int, high: int, used: set[int]) -> int | None:
    """A random time in ``[low, high]`` that no accepted event uses yet."""
    if high < low:
        return None
    ts = rng.randint(low, high)
    for candidate in itertools.chain(range(ts, high + 1), range(ts - 1, low - 1, -1)):
        if candidate not in used:
            return candidate
    return None
