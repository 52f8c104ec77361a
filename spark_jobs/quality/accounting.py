"""Where every input row went, checked in one place.

The stream, from its ingestion (spark_jobs.flows.ingestion)::

    input = accepted + quarantined + duplicates + dropped late + unmatched

and with a transform (``transform: {sql|python}``), whose result is what the stream
accepts, per stage::

    input = rows into the transform + quarantined + duplicates + dropped late + unmatched
    rows into the transform -> accepted rows (its result)

where a transform that gives at most one row per row it reads has its difference counted
as ``filtered`` (so ``input = accepted + filtered + ...``); one that can multiply rows
(explode, a join) is accounted by its rows in and out.

``input``, ``duplicates`` and rows dropped late by the deduplication come from the
ingestion's progress events (``numInputRows``, the deduplication's dropped rows,
``numRowsDroppedByWatermark``); its own ``ingested`` event of the same batch says how
many of the rest it accepted, quarantined, dropped late (without deduplication) and
left unmatched by an inner join. ``accepted`` and ``quarantined`` are then read back
from the two tables the ingestion wrote, so rows lost from either show up. Events are
folded into running totals kept in the quality ledger, so the check survives the
rotation of the event log.

Each output, from its own progress events and its sink::

    rows read = rows in its sink + rows its own watermark dropped

read back as the committed rows of a pass-through Parquet sink, or the sum of a plain
``count`` over a table without windows. A windowed append output holds its open
windows' rows in state, not in the sink, so its balance is reported as not checkable.
The output the ingestion serves (its sink is the accepted-rows table) has no query:
it reflects exactly the rows the ingestion accepted, read back from that table.

Spark posts a batch's progress event after its commit, and the listener writes it a
moment later, so a reader can see a commit whose event is not written yet. Such a
batch is not folded: the balance is ``pending`` until the event is there. A batch
whose event is missing while a later batch's event exists (the driver died between
the commit and the event) makes the balance ``incomplete``: reported, not failed.

No Spark here: the validation job reads the sinks and passes the counts in.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from spark_jobs.plan import DeltaDataset, OutputPlan, ParquetDataset, TableDataset
from spark_jobs.stream_spec.models import Aggregation, Passthrough

BALANCED, UNBALANCED, PENDING, INCOMPLETE, NOT_CHECKABLE = (
    "balanced", "unbalanced", "pending", "incomplete", "not checkable")


@dataclass
class Totals:
    """Running totals of one query's committed batches, folded from its progress events."""

    query_id: str | None = None
    through_batch: int = -1
    input: int = 0
    duplicates: int = 0
    dropped_late: int = 0
    sink_rows: int = 0
    accepted: int = 0
    quarantined: int = 0
    unmatched: int = 0
    transform_in: int | None = None  # with a transform: the rows that went into it
    filtered: int | None = None  # ...and those it gave nothing back for, if it cannot multiply rows
    missing_batches: list[int] = field(default_factory=list)
    waiting_for: int | None = None  # a committed batch whose progress event is not written yet

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Totals:
        return cls(**data) if data else cls()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fold(totals: Totals, events: list[dict[str, Any]], query_id: str | None, last_committed: int | None,
         ingestion: bool = False) -> Totals:
    """Add the progress events of batches committed since the last fold (for the
    ingestion, with its ``ingested`` event of the same batch).

    A new query id (the checkpoint was reset) starts the totals again. Folding stops
    before a committed batch whose event is not written yet (no later batch has one);
    the next fold takes it up.
    """
    if query_id is None or last_committed is None:
        return Totals(query_id=query_id)
    if totals.query_id != query_id:
        totals = Totals(query_id=query_id)
    by_batch: dict[int, dict[str, Any]] = {}
    ingested: dict[int, dict[str, Any]] = {}
    for e in events:
        if e.get("id") == query_id and isinstance(e.get("batch_id"), int):
            # a batch replayed after a crash: its last run counts
            if e.get("event") == "progress":
                by_batch[e["batch_id"]] = e
            elif e.get("event") == "ingested":
                ingested[e["batch_id"]] = e
    newest_event = max(by_batch, default=-1)
    out = Totals(**{**totals.to_dict(), "missing_batches": list(totals.missing_batches), "waiting_for": None})
    for batch in range(totals.through_batch + 1, last_committed + 1):
        e = by_batch.get(batch)
        if e is None and batch > newest_event:
            out.waiting_for = batch
            return out
        out.through_batch = batch
        i = ingested.get(batch)
        if e is None or (ingestion and i is None):
            out.missing_batches.append(batch)
            continue
        out.input += int(e.get("input_rows") or 0)
        out.duplicates += int(e.get("dropped_duplicates") or 0)
        out.dropped_late += int(e.get("dropped_by_watermark") or 0)
        out.sink_rows += max(0, int(e.get("sink_rows") or 0))
        if i is not None:
            out.dropped_late += int(i.get("late") or 0)
            out.accepted += int(i.get("accepted") or 0)
            out.quarantined += int(i.get("quarantined") or 0)
            out.unmatched += int(i.get("unmatched") or 0)
            if "transform_in" in i:
                out.transform_in = (out.transform_in or 0) + int(i["transform_in"] or 0)
            if "filtered" in i:
                out.filtered = (out.filtered or 0) + int(i["filtered"] or 0)
    return out


def accepted_measure(output: OutputPlan) -> str | None:
    """How an output's accepted rows are read from its sink, or None if they cannot be."""
    q = output.query
    if isinstance(q, Passthrough) and (isinstance(output.sink, ParquetDataset)
                                       or (isinstance(output.sink, DeltaDataset) and output.mode == "append")):
        return "rows"
    if isinstance(q, Aggregation) and q.window is None and (
            isinstance(output.sink, TableDataset) or (isinstance(output.sink, DeltaDataset) and output.mode != "append")):
        for agg in q.aggregates:
            if agg.fn == "count" and agg.column is None:
                return f"sum:{agg.name}"
    return None


@dataclass
class Balance:
    output: str
    status: str
    message: str
    input: int = 0
    accepted: int | None = None
    quarantined: int = 0
    duplicates: int = 0
    dropped_late: int = 0
    batches: int = 0
    unmatched: int = 0
    transform_in: int | None = None  # the stream's: rows into its transform (its result is ``accepted``)
    filtered: int | None = None  # ...those it gave nothing back for, if it gives at most one row per row

    @property
    def difference(self) -> int | None:
        if self.accepted is None:
            return None
        kept = self.accepted if self.transform_in is None else self.transform_in
        return self.input - (kept + self.quarantined + self.duplicates + self.dropped_late + self.unmatched)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "difference": self.difference}

    def describe(self) -> str:
        accepted = "?" if self.accepted is None else self.accepted
        if self.transform_in is not None and self.filtered is not None:
            accepted = f"{accepted} accepted + {self.filtered} filtered by the transform"
        elif self.transform_in is not None:
            accepted = f"{self.transform_in} into the transform (which gave {accepted} accepted rows)"
        else:
            accepted = f"{accepted} accepted"
        return (f"{self.output}: {self.status}: {self.input} in = {accepted} + {self.quarantined} quarantined "
                f"+ {self.duplicates} duplicates + {self.dropped_late} dropped late"
                + (f" + {self.unmatched} unmatched" if self.unmatched else "")
                + (f" ({self.message})" if self.message else ""))


#: The name of the stream's own balance among the outputs' balances.
INGESTION = "ingestion"


def _pending_or_incomplete(b: Balance, totals: Totals, sink_batches: dict[str, int | None]) -> Balance:
    if totals.waiting_for is not None:
        b.status, b.message = PENDING, f"the progress event of batch {totals.waiting_for} is not written yet"
        return b
    for sink, batch in sink_batches.items():
        if batch is not None and batch != totals.through_batch:
            b.status = PENDING
            b.message = f"the {sink} holds batch {batch}, the checkpoint committed {totals.through_batch}"
            return b
    if totals.missing_batches:
        shown = totals.missing_batches[:10]
        b.status = INCOMPLETE
        b.message = f"no progress event for batch(es) {shown}{'...' if len(totals.missing_batches) > 10 else ''}"
    return b


def _settle(b: Balance, what: str) -> Balance:
    if b.status == BALANCED and b.difference != 0:
        b.status = UNBALANCED
        b.message = (f"{abs(b.difference)} row(s) {'unaccounted for' if b.difference > 0 else 'more than the input'}"
                     f": {what}")
    return b


def ingestion_balance(totals: Totals, accepted: int, accepted_batch: int | None, quarantined: int,
                      quarantine_batch: int | None) -> Balance:
    """The stream's balance at the ingestion's last committed batch: its input against the
    rows its two tables hold (each read back at ``*_batch``) and the rows it dropped."""
    b = Balance(INGESTION, BALANCED, "", totals.input, accepted, quarantined, totals.duplicates, totals.dropped_late,
                totals.through_batch + 1, totals.unmatched, totals.transform_in, totals.filtered)
    b = _pending_or_incomplete(b, totals, {"accepted-rows table": accepted_batch, "quarantine": quarantine_batch})
    if b.status == BALANCED and (accepted, quarantined) != (totals.accepted, totals.quarantined):
        b.status = UNBALANCED
        b.message = (f"the tables hold {accepted} accepted and {quarantined} quarantined row(s), the ingestion "
                     f"counted {totals.accepted} and {totals.quarantined}: rows lost from or added to a table")
        return b
    return _settle(b, "rows lost, or counted twice")


def output_balance(output: str, totals: Totals, measured: int | None, measured_batch: int | None,
                   measure: str | None) -> Balance:
    """One output at its last committed batch: the accepted rows it read against its sink
    (``measured``, holding batches up to ``measured_batch``) and what its watermark dropped."""
    b = Balance(output, BALANCED, "", totals.input, measured, 0, 0, totals.dropped_late, totals.through_batch + 1)
    if measure is None:
        b.status, b.message, b.accepted = NOT_CHECKABLE, "its accepted rows are not readable from its sink", None
        return b
    b = _pending_or_incomplete(b, totals, {"sink": measured_batch})
    return _settle(b, "rows lost from or added to the sink")


def written_by_ingestion_balance(output: str, ingested: Totals, accepted: int, accepted_batch: int | None) -> Balance:
    """The output the ingestion serves: the rows the ingestion accepted against the rows
    its sink (the accepted-rows table, holding batches up to ``accepted_batch``) holds.
    Nothing is dropped between the two: they are one write."""
    b = Balance(output, BALANCED, "", ingested.accepted, accepted, batches=ingested.through_batch + 1)
    b = _pending_or_incomplete(b, ingested, {"sink": accepted_batch})
    if b.status == BALANCED and not b.message:
        b.message = "written by the ingestion: its sink is the accepted-rows table"
    return _settle(b, "rows lost from or added to the sink")


@dataclass
class StreamAccounting:
    input: int
    quarantined: int
    max_quarantine_rate: float
    balances: list[Balance]

    @property
    def quarantine_rate(self) -> float:
        return self.quarantined / self.input if self.input else 0.0

    @property
    def problems(self) -> list[str]:
        out = [f"accounting of {b.describe()}" for b in self.balances if b.status == UNBALANCED]
        if self.quarantine_rate > self.max_quarantine_rate:
            out.append(f"quarantine rate {self.quarantine_rate:.2%} ({self.quarantined} of {self.input} input rows) "
                       f"is above the threshold {self.max_quarantine_rate:.2%}")
        return out

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"input": self.input, "quarantined": self.quarantined, "quarantine_rate": self.quarantine_rate,
                "max_quarantine_rate": self.max_quarantine_rate, "ok": self.ok, "problems": self.problems,
                "balances": [b.to_dict() for b in self.balances]}
