"""Upkeep of a stream's Delta tables: ``spark-submit spark_jobs/maintenance.py --spec <spec>``.

For every Delta table of the stream (its Delta sinks, a Delta accepted-rows table), while
the stream runs:

* **compaction** (``OPTIMIZE``): the small files that micro-batches write, a few per
  partition per batch, are rewritten into few large ones. It only rewrites what is there:
  a batch appended meanwhile is kept; a conflict with a batch that replaced or merged rows
  (Delta's optimistic concurrency) is retried, here and in the sink
  (``spark_jobs.sinks.delta``), so no batch is lost;
* **vacuum** (``VACUUM``): the files no version within ``maintenance.vacuum_retention``
  references are deleted. It is refused, naming the reader, when a reader of the table
  needs an older version than that (:func:`readers`): the stream's own driver while it runs
  (a micro-batch writes its files before it commits them), the outputs that stream from a
  Delta accepted-rows table (the versions they have yet to read), and the last validation
  and the last in-place backfill of the table (which must give the same answer when run
  again). Below Delta's own 7-day floor the platform's check is the guard, so readers
  outside the platform are not protected.

Exit codes: 0 done (``--result`` says what), 2 invalid spec or parameters, or a vacuum
refused (the message names the table and the reader), 1 the run itself failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jobs.plan import StreamPlan, compile_plan
from spark_jobs.runtime.checkpoint import delta_read_through
from spark_jobs.runtime.driver import log_to_stderr
from spark_jobs.sinks.delta import commit_time, retry_conflicts
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import SpecError, duration_seconds

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("maintenance")

#: what the stream's running driver needs: a micro-batch's files exist before its commit
#: references them, so a vacuum must not take files younger than the longest batch
WRITER_NEEDS_SECONDS = 3600.0
#: Delta's own floor for VACUUM (``spark.databricks.delta.retentionDurationCheck``)
DELTA_FLOOR_SECONDS = 7 * 24 * 3600.0
class VacuumRefused(ValueError):
    """A vacuum's retention is shorter than what a reader of the table needs."""


@dataclass(frozen=True)
class Reader:
    """Someone who reads a table and so needs its old files for a while."""

    who: str
    needs_seconds: float


def readers(spark: SparkSession, layout: Layout, output: str, path: str, now: float | None = None,
            streaming: dict[str, str] | None = None) -> list[Reader]:
    """Who needs the table's old files, and for how long (see the module). ``streaming``: the
    queries that stream from the table (name -> checkpoint), which need every version after
    the last one they have read whole."""
    from spark_jobs.quality.ledger import Ledger
    from spark_jobs.runtime.lease import holder_alive

    now = time.time() if now is None else now
    found = []
    if holder_alive(layout.lease_dir):
        found.append(Reader(f"the stream's running driver (a micro-batch writes its files before its commit), "
                            f"at least {WRITER_NEEDS_SECONDS / 3600:g} hour", WRITER_NEEDS_SECONDS))
    for name, checkpoint in (streaming or {}).items():
        read = delta_read_through(checkpoint)
        unread = commit_time(spark, path, (read if read is not None else -1) + 1)
        if unread is not None:
            after = f"versions after {read}" if read is not None and read >= 0 else "any version whole"
            found.append(Reader(f"output {name}, which streams from the table and has yet to read {after}",
                                max(0.0, now - unread)))
    ledger_file = layout.quality_dir / "ledger.json"
    if ledger_file.exists():
        units = Ledger(ledger_file).data["outputs"].get(output, {}).get("units", {})
        versions = [u["version"] for u in units.values() if isinstance(u.get("version"), int)]
        if versions:
            found.append(Reader(f"the last validation of output {output} (version {max(versions)}), to be rerun",
                                _keeps(spark, path, max(versions), now)))
    backfill = _last_backfill(layout, output, path)
    if backfill is not None:
        label, version = backfill
        found.append(Reader(f"the last backfill of output {output} ({label}, version {version}), whose validation "
                            "reads that version again", _keeps(spark, path, version, now)))
    return found


def _keeps(spark: SparkSession, path: str, version: int, now: float) -> float:
    """How long the files of ``version`` must be kept for it to be read again. They are removed
    only by later commits, so the first of them bounds it (none yet: nothing to keep; gone from
    the log: the version cannot be read again anyway)."""
    after = commit_time(spark, path, version + 1)
    return max(0.0, now - after) if after is not None else 0.0


def _last_backfill(layout: Layout, output: str, path: str) -> tuple[str, int] | None:
    """The range and version of the newest backfill written into the table in place
    (``spark_jobs.backfill``), if any."""
    newest: tuple[str, int, str] | None = None
    for record_file in layout.backfill_dir(output).glob("*.json"):
        try:
            record = json.loads(record_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("table") == path and isinstance(record.get("version"), int):
            if newest is None or str(record.get("written")) > newest[2]:
                newest = (record_file.stem, record["version"], str(record.get("written")))
    return None if newest is None else newest[:2]


def check_retention(spark: SparkSession, layout: Layout, output: str, path: str, retention_seconds: float,
                    streaming: dict[str, str] | None = None) -> None:
    """Raise :class:`VacuumRefused` naming the reader whose need is longer than the retention."""
    for reader in readers(spark, layout, output, path, streaming=streaming):
        if reader.needs_seconds > retention_seconds:
            raise VacuumRefused(
                f"vacuum of {output}'s Delta table {path} with a retention of {retention_seconds:g}s refused: "
                f"{reader.who} needs {reader.needs_seconds:.0f}s; raise maintenance.vacuum_retention")


def streaming_readers(plan: StreamPlan, path: str) -> dict[str, str]:
    """The outputs that stream from the table at ``path`` (the accepted-rows table's readers):
    name -> checkpoint."""
    if plan.ingestion is None or not plan.ingestion.accepted_is_delta or path != plan.ingestion.accepted_path:
        return {}
    return {o.name: o.checkpoint for o in plan.outputs_with_flows if o.checkpoint and not o.reads_source}


def optimize(spark: SparkSession, path: str) -> dict[str, Any]:
    """Compact the table (retried on a conflicting commit): files removed and added."""
    from delta.tables import DeltaTable

    def run() -> Any:
        return DeltaTable.forPath(spark, path).optimize().executeCompaction().collect()[0]["metrics"]

    metrics = retry_conflicts(f"compaction of {path}", run)
    return {"files_removed": int(metrics["numFilesRemoved"]), "files_added": int(metrics["numFilesAdded"])}


#: tasks that list a table's folders for a vacuum (Spark's default, 10,000, is for a cluster's
#: thousands of partitions: on a small machine their scheduling alone takes a minute)
LISTING_TASKS = "8"


def vacuum(spark: SparkSession, path: str, retention_seconds: float) -> dict[str, Any]:
    """Delete the files no version within the retention references: how many (the vacuum's
    own count, in its commit). Below Delta's 7-day floor its own check is turned off for this
    command only (the caller checked the platform's readers)."""
    from delta.tables import DeltaTable

    settings = {"spark.sql.sources.parallelPartitionDiscovery.parallelism": LISTING_TASKS}
    if retention_seconds < DELTA_FLOOR_SECONDS:
        settings["spark.databricks.delta.retentionDurationCheck.enabled"] = "false"
    before = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        spark.sql(f"VACUUM delta.`{path}` RETAIN {retention_seconds / 3600:.6f} HOURS").collect()
    finally:
        for key, value in before.items():
            spark.conf.unset(key) if value is None else spark.conf.set(key, value)
    end = DeltaTable.forPath(spark, path).history(1).collect()[0]
    deleted = int((end.operationMetrics or {}).get("numDeletedFiles", 0)) if end.operation == "VACUUM END" else 0
    return {"files_deleted": deleted, "retention_seconds": retention_seconds}


def table_figures(spark: SparkSession, path: str) -> dict[str, Any]:
    """Files, bytes and version of the table's newest version (a commit landing between the
    two reads makes the figures a version apart: they are a report, not a snapshot)."""
    from delta.tables import DeltaTable

    table = DeltaTable.forPath(spark, path)
    version = table.history(1).collect()[0].version
    detail = table.detail().collect()[0]
    return {"files": int(detail["numFiles"]), "bytes": int(detail["sizeInBytes"]), "version": int(version)}


def run(spark: SparkSession, plan: StreamPlan, layout: Layout, compact: bool, vacuum_retention: float | None,
        ) -> dict[str, Any]:
    """Compact, then vacuum every Delta table of the stream; what was done per table."""
    from delta.tables import DeltaTable

    tables = []
    for output, path in plan.delta_tables.items():
        if not DeltaTable.isDeltaTable(spark, path):
            tables.append({"output": output, "path": path, "note": "no table yet"})
            continue
        entry: dict[str, Any] = {"output": output, "path": path, "before": table_figures(spark, path)}
        if compact:
            entry["optimize"] = optimize(spark, path)
        if vacuum_retention is not None:
            try:
                check_retention(spark, layout, output, path, vacuum_retention, streaming_readers(plan, path))
                entry["vacuum"] = vacuum(spark, path, vacuum_retention)
            except VacuumRefused as exc:
                log.error("%s", exc)
                entry["vacuum"] = {"refused": str(exc)}
        entry["after"] = table_figures(spark, path)
        log.info("%s: %s", output, json.dumps(entry))
        tables.append(entry)
    return {"stream": plan.stream, "tables": tables,
            "refused": [t["vacuum"]["refused"] for t in tables if "refused" in t.get("vacuum", {})]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", required=True, help="the stream's spec file")
    p.add_argument("--data-root", default=None, help="root of relative data paths (default: $STREAMS_DATA_DIR or ./data)")
    p.add_argument("--retention", default=None, help="vacuum retention, e.g. '7 days' (default: the spec's)")
    p.add_argument("--no-vacuum", action="store_true", help="compact only")
    p.add_argument("--no-compact", action="store_true", help="vacuum only")
    p.add_argument("--result", type=Path, help="write the run's result here as JSON")
    args = p.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        layout = Layout(spec, args.data_root, Path(args.spec).resolve().parent)
        upkeep = spec.maintenance
        retention = None if args.no_vacuum or not upkeep.vacuum else duration_seconds(
            args.retention or upkeep.vacuum_retention)
    except (SpecError, ValueError) as exc:
        log.error("%s", exc)
        return 2
    from spark_jobs.runtime.session import build_session

    spark = build_session(f"maintenance:{spec.name}", spec)
    try:
        result = run(spark, compile_plan(spec, layout), layout, compact=upkeep.compact and not args.no_compact,
                     vacuum_retention=retention)
    finally:
        spark.stop()
    if args.result:
        args.result.parent.mkdir(parents=True, exist_ok=True)
        args.result.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 2 if result["refused"] else 0


if __name__ == "__main__":
    log_to_stderr()
    sys.exit(main())
