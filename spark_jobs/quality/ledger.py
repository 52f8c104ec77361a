"""What has been validated: ``<data root>/quality/<stream>/ledger.json``.

Per output: the watermark up to which closed units have been validated (a unit closes
when the watermark passes its end, so later runs only look beyond it), the checkpoint's
query id it belongs to (a reset checkpoint starts again), the last validated table
snapshot, and a record per unit: pass or fail, rows, failed checks, Data Docs page.
Backfilled ranges have their own records, replaced when a range is backfilled again.
The accounting's running totals live here too. Written atomically (temporary file,
then rename): a crash leaves the previous ledger, and the next run repeats that work.
One validation run of a stream at a time (:func:`run_lock`): a scheduled run and a
backfill's validation would otherwise each save their own copy of the ledger.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spark_jobs.runtime.atomic import write_atomically

log = logging.getLogger(__name__)

#: Unit records kept per output; older ones are summarised in ``pruned``.
MAX_UNITS = 5000
MAX_RUNS = 100


class Ledger:
    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        try:
            self.data: dict[str, Any] = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            self.data = {}
        except (OSError, ValueError) as exc:
            raise ValueError(f"the quality ledger {self.path} is unreadable ({exc}); move it aside to validate "
                             f"every closed unit again") from None
        self.data.setdefault("version", 1)
        self.data.setdefault("outputs", {})
        self.data.setdefault("totals", {})
        self.data.setdefault("backfills", {})
        self.data.setdefault("runs", [])

    def output(self, name: str, query_id: str | None) -> dict[str, Any]:
        """The output's record; reset (units kept) when its checkpoint has a new query id."""
        entry = self.data["outputs"].setdefault(name, {"units": {}, "pruned": {"passed": 0, "failed": 0}})
        if entry.get("query_id") != query_id:
            entry.update(query_id=query_id, watermark_ms=None, snapshot_batch=None)
        return entry

    def record_units(self, name: str, records: list[dict[str, Any]]) -> None:
        entry = self.data["outputs"][name]
        units = entry["units"]
        for r in records:
            units.pop(r["unit"], None)
            units[r["unit"]] = r
        while len(units) > MAX_UNITS:
            oldest = next(iter(units))
            entry["pruned"][units.pop(oldest)["status"]] += 1

    def record_backfill(self, name: str, record: dict[str, Any]) -> None:
        self.data["backfills"].setdefault(name, {})[record["unit"]] = record

    def record_run(self, summary: dict[str, Any]) -> None:
        self.data["runs"] = (self.data["runs"] + [summary])[-MAX_RUNS:]

    def save(self) -> None:
        write_atomically(self.path, json.dumps(self.data, indent=1, default=str))


def read_ledger(quality_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The stream's ledger as it is on disk, for readers that only look (the Streams pages, the
    sinks' asset triggers, the platform's summary): ``{}`` when there is none or it cannot be read."""
    try:
        data = json.loads((Path(quality_dir) / "ledger.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def problems_since(ledger: dict[str, Any], since: float, outputs: list[str]) -> tuple[list[str], int]:
    """What the stream's validations after ``since`` (epoch seconds) found wrong with ``outputs``
    and the stream's own accounting (``ledger``: :func:`read_ledger`): failed units and unbalanced
    balances, each in words; and how many runs validated after ``since``. An upgrade's watch asks."""
    from spark_jobs.quality.accounting import INGESTION, UNBALANCED
    from spark_jobs.runtime.clock import epoch_seconds

    def after(at: Any) -> bool:  # the ledger's times are whole seconds
        return (when := epoch_seconds(at)) is not None and when >= int(since)

    problems, runs = [], [r for r in ledger.get("runs") or [] if after(r.get("at")) and not r.get("backfill")]
    for name in outputs:
        for unit in ((ledger.get("outputs") or {}).get(name) or {}).get("units", {}).values():
            if unit.get("status") == "failed" and after(unit.get("validated_at")):
                problems.append(f"{name} {unit.get('unit')} ({unit.get('rows')} rows): failed "
                                f"{'; '.join(map(str, unit.get('failed') or []))}")
    for run in runs:
        for balance in (run.get("accounting") or {}).get("balances") or []:
            if balance.get("status") == UNBALANCED and balance.get("output") in (*outputs, INGESTION):
                problems.append(f"run {run.get('run_id')}: the accounting of {balance.get('output')} is unbalanced: "
                                f"{balance.get('message')}")
    return problems, len(runs)


@contextlib.contextmanager
def run_lock(directory: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the stream's validation lock (``<quality dir>/run.lock``), waiting for a run that holds it.

    The lock is the operating system's: it is released when its holder exits, however
    it exits. The wait is bounded by the Airflow task's own timeout.
    """
    path = Path(directory) / "run.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another validation run of this stream holds %s; waiting for it to end", path)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
