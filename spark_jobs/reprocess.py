"""A reprocess: an upgrade (``spark_jobs.upgrade``) whose ingestion changed in a way its
checkpoint cannot honour (the source, a column's type, the deduplication key, the accepted-rows
table: a ``reprocess`` verdict of ``spark_jobs.changes``). The input is read again from its
start by the new plan's ingestion into new tables, and every output is computed again from
them, all beside the live ones; the swap then puts every one of them in place.

* **The input.** Files: the landing folder's files and the archive's are linked (copied across
  file systems) into a *replay* folder beside the landing folder (``.<landing>.upgrade-<n>``),
  which the staged ingestion reads, available-now, under a checkpoint of its own. At the swap
  its file-source log is rewritten to name the landing folder, so the stream's driver then
  takes only the files that landed after the replay was made (and the archiving goes on as
  before). The input itself is never moved. Kafka: the staged ingestion reads from the spec's
  ``starting_offsets``; from ``earliest``, refused once retention deleted a topic's first
  records (the new tables would drop rows the accepted rows hold), unless the spec chooses the
  offsets.
* **The tables.** The accepted rows and the quarantine are written into staged folders beside
  theirs; the outputs read the staged accepted rows. At the swap each staged folder is
  exchanged with its live one (a Parquet table's ``_spark_metadata`` log first rewritten to
  name the live path; a Delta table's log names no folder), and the outputs' checkpoints'
  source logs are rewritten to name the live accepted rows, which they read from then on.
* **The savepoint** holds the ingestion's checkpoint with the outputs'; a rollback exchanges
  the tables back and puts every checkpoint back.

The staged ingestion writes its progress to the stream's events as the driver does, so the
accounting of the new accepted rows balances from its first batch.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from spark_jobs.plan import StreamPlan
from spark_jobs.runtime.atomic import exchange
from spark_jobs.runtime.checkpoint import landed_files, query_id
from spark_jobs.runtime.staging import relocate_log, staged_sink, swap_folder, swapped_in_by
from spark_jobs.stream_spec.models import INGEST_FLOW

log = logging.getLogger("upgrade")


class CannotReprocess(ValueError):
    """The input cannot be read again as the change needs; nothing was changed."""


def reprocessing(record: dict[str, Any]) -> bool:
    """Whether the upgrade of ``record`` reads the input again (its ingestion is rebuilt)."""
    return INGEST_FLOW in record["rebuild"]


def outputs_of(record: dict[str, Any]) -> list[str]:
    """The outputs an upgrade rebuilds (a reprocess: every one with a query)."""
    return [name for name in record["rebuild"] if name != INGEST_FLOW]


def flows(plan: StreamPlan, spec_file: str) -> list[str]:
    """What a reprocess rebuilds: the ingestion, then every output with a query of its own (the
    one the ingestion writes comes with the accepted rows); refused (``CannotReprocess``) for a
    source that cannot be read again from its start."""
    source = plan.source
    if plan.ingestion is None or source is None or not ((source.is_files and source.landing) or source.kind == "kafka"):
        kind = source.kind if source is not None else "no"
        raise CannotReprocess(f"{spec_file}: the ingestion's change needs its input read again, which a {kind} source "
                              "cannot give: restore the ingestion's part of the spec, or move the stream's checkpoint, "
                              "sinks and quarantine aside and start it afresh (docs/changes.md)")
    _refuse_lost_records(plan, spec_file)
    return [INGEST_FLOW, *(o.name for o in plan.outputs_with_flows)]


def _refuse_lost_records(plan: StreamPlan, spec_file: str) -> None:
    """A Kafka stream read again from ``earliest`` would silently lose the records its topics no
    longer keep (retention), which its accepted rows hold now: refused, naming them, unless the
    spec chooses the offsets to start from (``source.starting_offsets``: Spark's JSON of offsets)."""
    from spark_jobs.sources import kafka

    source = plan.source
    if source is None or source.kafka is None or source.kafka.starting_offsets != "earliest":
        return
    offsets = kafka.end_offsets(source.kafka, kafka.probe(source.kafka, source.options), source.options)
    gone = {f"{t}/{p}": low for (t, p), (low, _) in sorted(offsets.items()) if low > 0}
    if gone:
        raise CannotReprocess(
            f"{spec_file}: the ingestion's change needs its topics read again from the first record, but the broker "
            "no longer keeps the first ones (retention): "
            + ", ".join(f"offsets 0 to {low - 1} of {tp}" for tp, low in gone.items())
            + "; the accepted rows hold what the stream read of them, which a reprocess would drop. Choose where to "
            "start in source.starting_offsets (Spark's JSON of offsets per partition) to reprocess from there, or "
            "restore the ingestion's part of the spec")


def position(plan: StreamPlan, number: int) -> dict[str, Any]:
    """Where the staged ingestion reads and writes: the upgrade's record keeps it."""
    ingestion, source = plan.ingestion, plan.source
    assert ingestion is not None and source is not None
    return {"checkpoint": ingestion.checkpoint,
            "accepted": {"path": ingestion.accepted_path, "format": ingestion.accepted_format,
                         "staged": staged_sink(ingestion.accepted_path, number)},
            "quarantine": ({"path": ingestion.quarantine, "staged": staged_sink(ingestion.quarantine, number)}
                           if ingestion.quarantine else None),
            "replay": staged_sink(source.landing, number) if source.is_files and source.landing else None,
            "landing": source.landing if source.is_files else None,
            "archive": source.archive_path if source.is_files else None}


def staged_checkpoint(record: dict[str, Any]) -> str:
    return str(Path(record["folder"]) / "staged" / INGEST_FLOW)


def staged(plan: StreamPlan, record: dict[str, Any]) -> StreamPlan:
    """``plan`` with its ingestion reading the replay and writing the staged tables under its staged
    checkpoint, and its outputs reading the staged accepted rows."""
    place = record["ingestion"]
    assert plan.ingestion is not None and plan.source is not None
    ingestion = replace(plan.ingestion, checkpoint=staged_checkpoint(record), accepted_path=place["accepted"]["staged"],
                        quarantine=place["quarantine"]["staged"] if place["quarantine"] else None)
    source = replace(plan.source, landing=place["replay"], replay_of=place["landing"]) if place["replay"] else plan.source
    outputs = [replace(o, sink=replace(o.sink, path=ingestion.accepted_path)) if o.written_by_ingestion else o
               for o in plan.outputs]
    return replace(plan, ingestion=ingestion, source=source, outputs=outputs,
                   checkpoints=plan.checkpoints | {INGEST_FLOW: ingestion.checkpoint})


def replay(record: dict[str, Any]) -> int:
    """Link the landing folder's files, then the archive's, into the replay folder (a file of the same
    name in both: the landing folder's, the one its log will name); a killed try's links are kept.
    How many files the replay holds."""
    place = record["ingestion"]
    if not place["replay"]:
        return 0
    target = Path(place["replay"])
    target.mkdir(parents=True, exist_ok=True)
    for origin in (place["landing"], place["archive"]):
        if not origin:
            continue
        for landed in landed_files(origin):
            link = target / landed.name
            if link.exists():
                continue
            try:
                os.link(Path(origin) / landed.name, link)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                    raise
                copying = target / f".{landed.name}.copying"
                shutil.copy2(Path(origin) / landed.name, copying)  # its time too: the file source keeps it
                os.replace(copying, link)
    return len(landed_files(target))


def swap(record: dict[str, Any], staged_outputs: dict[str, str]) -> None:
    """The staged tables take the live ones' places; the outputs' staged checkpoints (``staged_outputs``:
    output -> its staged checkpoint) are rewritten to read the live accepted rows; then the staged
    ingestion's checkpoint, rewritten to name the landing folder, takes the live one's place. Each
    step a killed try took already is recognised and not taken again."""
    place, number = record["ingestion"], record["number"]
    accepted = place["accepted"]
    swap_folder(accepted["staged"], accepted["path"], number, log_names_paths=accepted["format"] != "delta")
    if place["quarantine"]:
        Path(place["quarantine"]["staged"]).mkdir(parents=True, exist_ok=True)  # nothing quarantined: empty
        swap_folder(place["quarantine"]["staged"], place["quarantine"]["path"], number)
    if accepted["format"] != "delta":
        for checkpoint in staged_outputs.values():
            if Path(checkpoint, "sources").is_dir():
                relocate_log(Path(checkpoint) / "sources", accepted["staged"], accepted["path"])
    new, live = staged_checkpoint(record), place["checkpoint"]
    if not (Path(live).exists() and query_id(live) == place["query"]):  # else swapped by a killed try
        if place["replay"] and Path(new, "sources").is_dir():
            relocate_log(Path(new) / "sources", place["replay"], place["landing"])
        if Path(live).exists():
            exchange(new, live)
        else:
            Path(live).parent.mkdir(parents=True, exist_ok=True)
            os.replace(new, live)
    if place["replay"]:
        shutil.rmtree(place["replay"], ignore_errors=True)
    log.info("the reprocessed accepted rows%s are live (%s)", " and quarantine" if place["quarantine"] else "",
             accepted["path"])


def roll_back(record: dict[str, Any]) -> None:
    """The live tables back (exchanged with the staged places, which hold them), the replay gone; the
    ingestion's checkpoint is put back with the outputs' (``upgrade.rollback``)."""
    place, number = record["ingestion"], record["number"]
    for table in (place["accepted"], place["quarantine"]):
        if not table:
            continue
        if swapped_in_by(table["path"]) == number:
            if Path(table["staged"]).exists():
                exchange(table["staged"], table["path"])
            else:
                shutil.rmtree(table["path"])
        shutil.rmtree(table["staged"], ignore_errors=True)
    if place["replay"]:
        shutil.rmtree(place["replay"], ignore_errors=True)


def clean(record: dict[str, Any]) -> list[str]:
    """What a done reprocess keeps for a rollback: the old tables (at their staged places)."""
    removed = []
    for table in (record["ingestion"]["accepted"], record["ingestion"]["quarantine"]):
        if table and Path(table["staged"]).exists():
            shutil.rmtree(table["staged"])
            removed.append(f"upgrade {record['number']}: the old {table['path']}")
    return removed
