"""What a stream's state holds: ``spark-submit spark_jobs/state.py --spec <spec>``.

A short Spark job of its own, never the stream's driver: for each flow with state (the
ingestion's deduplication, each output's aggregation), at its last committed batch, Spark's
state data sources (``state-metadata``: the stateful operators; ``statestore``: their keys and
values) say what is kept:

* a **windowed aggregation**: the open windows (kept until the watermark passes their end),
  the oldest and the newest, the rows per window, and the watermark the oldest waits for;
* a **deduplication**: the keys kept, and when the oldest and the newest expire (the
  watermark drops a key once it passes its expiry);
* any other aggregation: the groups kept.

Rows are counted from the state itself; bytes are what Spark reported for the same batch
(``memoryUsedBytes`` of the batch's progress). The result goes to ``_control/state.json``
beside the checkpoint (``Layout.state_file``), with the batch it describes, for the
stream's page. The state sources are read-only: the live checkpoint is never written.

Exit codes: 0 read, 2 invalid spec, 1 failure.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jobs.plan import StreamPlan, compile_plan
from spark_jobs.runtime.atomic import write_atomically
from spark_jobs.runtime.checkpoint import batch_watermark_ms, last_batch
from spark_jobs.runtime.clock import iso
from spark_jobs.runtime.driver import log_to_stderr
from spark_jobs.runtime.progress import read_events
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import SpecError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("state")

#: the state store's upkeep off: loaded for reading, a store would otherwise be kept up by Spark's
#: maintenance task, which writes snapshots into (and deletes old files from) the live checkpoint
READ_ONLY = {"spark.sql.streaming.stateStore.maintenanceInterval": "3650d",
             "spark.sql.streaming.stateStore.minDeltasForSnapshot": "1000000000"}
#: the open windows listed per operator (oldest first); the counts cover them all
WINDOWS_LISTED = 50
#: the value field that a deduplication within the watermark keeps per key
EXPIRES_AT = "expiresAtMicros"


def _micros_iso(micros: int | None) -> str | None:
    return None if micros is None else iso(micros / 1_000_000)


def _bytes_at(events: list[dict[str, Any]], flow: str, batch: int) -> int | None:
    """The state's bytes as Spark reported them for the flow's batch (its progress event)."""
    for event in reversed(events):
        if event.get("event") == "progress" and event.get("query") == flow and event.get("batch_id") == batch:
            return event.get("state_bytes")
    return None


def _windows(state: DataFrame) -> dict[str, Any]:
    """The open windows of a windowed aggregation's state: count, oldest, newest, rows each."""
    from pyspark.sql import functions as F

    per_window = (state.groupBy(F.col("key.window.start").alias("start"), F.col("key.window.end").alias("end"))
                  .agg(F.count(F.lit(1)).alias("rows")).orderBy("start", "end").collect())
    listed = [{"start": iso(w["start"].timestamp()), "end": iso(w["end"].timestamp()), "rows": w["rows"]}
              for w in per_window]
    return {"open": len(listed), "oldest": listed[0] if listed else None, "newest": listed[-1] if listed else None,
            "listed": listed[:WINDOWS_LISTED]}


def _kept_keys(state: DataFrame) -> dict[str, Any]:
    """A deduplication's keys: when the oldest and the newest expire."""
    from pyspark.sql import functions as F

    row = state.agg(F.min(f"value.{EXPIRES_AT}").alias("oldest"), F.max(f"value.{EXPIRES_AT}").alias("newest")).first()
    return {"oldest_expires": _micros_iso(row["oldest"]), "newest_expires": _micros_iso(row["newest"])}


def operator_state(spark: SparkSession, checkpoint: str, batch: int, operator: Any) -> dict[str, Any]:
    """One stateful operator's state at ``batch`` (``operator``: a ``state-metadata`` row)."""
    found: dict[str, Any] = {"operator_id": operator["operatorId"], "operator": operator["operatorName"],
                             "store": operator["stateStoreName"], "partitions": operator["numPartitions"]}
    if operator["stateStoreName"] != "default":  # a stream-stream join's stores: read per side, not here
        return found | {"kind": "join", "rows": None}
    state = (spark.read.format("statestore").option("batchId", batch).option("operatorId", operator["operatorId"])
             .option("storeName", operator["stateStoreName"]).load(checkpoint)).cache()
    try:
        key, value = state.schema["key"].dataType, state.schema["value"].dataType
        found["key"] = [f.name for f in key.fields]
        found["rows"] = state.count()
        if "window" in key.fieldNames():
            found |= {"kind": "window", "windows": _windows(state)}
        elif EXPIRES_AT in value.fieldNames():
            found |= {"kind": "deduplication", "expiry": _kept_keys(state)}
        else:
            found["kind"] = "aggregation"
    finally:
        state.unpersist()
    return found


def flow_state(spark: SparkSession, checkpoint: str, events: list[dict[str, Any]], flow: str) -> dict[str, Any] | None:
    """A flow's state at its last committed batch; None if it keeps none (or committed nothing)."""
    batch = last_batch(checkpoint, "commits")
    if batch is None:
        return None
    try:
        operators = spark.read.format("state-metadata").load(checkpoint).collect()
    except Exception as exc:  # no state folder: a stateless flow (Spark says so its own way)
        if "state" in str(exc).lower() and not (Path(checkpoint) / "state").exists():
            return None
        raise
    if not operators:
        return None
    watermark = batch_watermark_ms(checkpoint, batch)  # 0: the flow has no watermark
    return {"batch": batch, "watermark": iso(watermark / 1000) if watermark else None,
            "bytes": _bytes_at(events, flow, batch),
            "operators": [operator_state(spark, checkpoint, batch, o) for o in operators]}


def inspect(spark: SparkSession, plan: StreamPlan, layout: Layout) -> dict[str, Any]:
    """The state of every flow of the stream with state, each at its own last committed batch."""
    spark.streams.active  # noqa: B018 - the state store's coordinator, which the state reader asks
    events = list(read_events(layout.events_file))
    flows = {}
    for flow in plan.flows:
        found = flow_state(spark, plan.checkpoint(flow), events, flow)
        if found is not None:
            flows[flow] = found
    return {"stream": plan.stream, "inspected_at": iso(time.time()), "flows": flows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", required=True, help="the stream's spec file")
    p.add_argument("--data-root", default=None, help="root of relative data paths (default: $STREAMS_DATA_DIR or ./data)")
    p.add_argument("--result", type=Path, help="also write the result here (it always goes to _control/state.json)")
    args = p.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        layout = Layout(spec, args.data_root, Path(args.spec).resolve().parent)
    except SpecError as exc:
        log.error("%s", exc)
        return 2
    from spark_jobs.runtime.session import build_session, yield_cpu

    yield_cpu()  # the stream whose state this reads runs on the same cores: it goes first
    spark = build_session(f"state:{spec.name}", spec, extra=READ_ONLY)
    try:
        result = inspect(spark, compile_plan(spec, layout), layout)
    finally:
        spark.stop()
    text = json.dumps(result, indent=1)
    write_atomically(layout.state_file, text)
    if args.result:
        write_atomically(args.result, text)
    for flow, found in result["flows"].items():
        log.info("%s at batch %s: %s", flow, found["batch"],
                 "; ".join(f"{o['operator']} {o.get('kind')}: {o.get('rows')} row(s)" for o in found["operators"]))
    return 0


if __name__ == "__main__":
    log_to_stderr()
    sys.exit(main())
