"""Exactly once from a Kafka topic under the real platform: Airflow's scheduler, DAG
processor, triggerer and API server, the stream deployed through its DAG and its driver
restarted by its supervisor, reading a three-partition topic of a real broker.

The clicks example, with a transform (a derived column), a windowed SQL output beside its
own window and table outputs, and a Kafka sink, on a one-second trigger at most 60 records a
micro-batch, is fed by the generator (each file one Kafka transaction: late, duplicate and
malformed records among valid ones) and its driver killed with SIGKILL twice (mid-batch and
right after a commit). Its accepted rows are a Delta table, which the
maintenance DAG compacts (with the Delta sink) while the stream commits batches. Then every
sink equals the ground truth, the
quarantine holds exactly the bad records (by topic/partition@offset), every output equals its
query over the accepted rows, every input record is accounted for (accepted + quarantined +
duplicates + dropped late, measured from the progress events), a consumer that drops replayed
batches reads each accepted record once from the Kafka sink, and no two drivers held the
stream at once (the lease's history).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest
from airflow_harness import Airflow, deploy, example_spec, include_with, one_driver_at_a_time, stream_drivers, wait_for

from runner.testdata import generate, verify
from runner.testdata import groundtruth as gt
from spark_jobs import analysis
from spark_jobs.frames import accepted_batch
from spark_jobs.plan import compile_plan
from spark_jobs.runtime.checkpoint import batch_ids, batch_watermark_ms, last_batch, read_query_checkpoint
from spark_jobs.runtime.lease import read_holder
from spark_jobs.runtime.progress import read_events
from spark_jobs.sinks import delta_log
from spark_jobs.sinks.kafka import BATCH_HEADER
from spark_jobs.sources import kafka
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec, parse_spec
from spark_jobs.stream_spec.models import INGEST_FLOW
from streamops.health import Status, assess

pytestmark = pytest.mark.e2e

SEED = 5
TRANSFORM = "SELECT *, page LIKE '/product/%' AS product_page FROM input"
PRODUCT_VIEWS = ("SELECT window.start AS window_start, window.end AS window_end, category, count(*) AS views "
                 "FROM accepted WHERE product_page GROUP BY window(ts, '5 minutes'), category")


def kafka_spec(root: Path, topic: str, sink_topic: str) -> Path:
    spec = example_spec("clicks")
    spec["source"] |= {"topics": [topic], "max_offsets_per_trigger": 60}
    spec["trigger"] = {"processing_time": "1 second"}
    spec["accepted"] = {"format": "delta"}
    spec["maintenance"] = {**spec["maintenance"], "schedule": None, "vacuum": False}  # the test's run; compaction
    spec["transform"] = {"sql": TRANSFORM}
    spec["outputs"] += [
        {"name": "product_views_5m", "mode": "append", "query": {"type": "sql", "sql": PRODUCT_VIEWS},
         "sink": {"type": "parquet", "path": "sinks/clicks/product_views_5m"}},
        {"name": "to_topic", "mode": "append", "query": {"type": "passthrough", "columns": ["event_id", "page", "ts"]},
         "sink": {"type": "kafka", "topic": sink_topic, "bootstrap_servers": "${KAFKA_BOOTSTRAP_SERVERS}"}},
    ]
    spec["supervision"] = {"stall_window": "90 seconds",
                           "restart": {"max_attempts": 10, "backoff_initial_seconds": 1, "backoff_max_seconds": 4,
                                       "stable_after_minutes": 10}}
    return include_with(root, spec) / "clicks.yaml"


def compacted_while_streaming(plan, layout: Layout, ingestion: Path, run: dict) -> None:  # a StreamPlan
    """The maintenance run compacted each Delta table that had more than one file in a
    partition (the accepted rows had), into one file per partition, while the stream
    committed batches into the accepted rows."""
    start, end = (datetime.fromisoformat(run[k]).timestamp() for k in ("start_date", "end_date"))
    print(f"the maintenance run took {end - start:.1f}s")
    assert any(start <= f.stat().st_mtime <= end for f in (ingestion / "commits").glob("[0-9]*")), \
        "no batch committed while the maintenance ran"
    (result,) = (json.loads(f.read_text()) for f in (layout.maintenance_dir / "runs").glob("*.json"))
    tables = {t["output"]: t for t in result["tables"]}
    assert set(tables) == set(plan.delta_tables) == {"_accepted", "views_per_minute"}
    assert tables["_accepted"]["optimize"]["files_removed"] > 1, tables["_accepted"]
    for name, path in plan.delta_tables.items():
        optimized = [actions for actions in (delta_log.actions(path, v) or [] for v in delta_log.versions(path))
                     if any(a.get("commitInfo", {}).get("operation") == "OPTIMIZE" for a in actions)]
        assert len(optimized) == (1 if tables[name]["optimize"]["files_removed"] else 0), (name, tables[name])
        for actions in optimized:
            removed = [json.dumps(a["remove"].get("partitionValues"), sort_keys=True) for a in actions if "remove" in a]
            added = [json.dumps(a["add"].get("partitionValues"), sort_keys=True) for a in actions if "add" in a]
            assert len(removed) > len(added) and sorted(added) == sorted(set(removed)), (name, removed, added)
        print(f"{name}: {tables[name]['before']['files']} files before the maintenance; its compaction rewrote "
              f"{tables[name]['optimize']['files_removed']} into {tables[name]['optimize']['files_added']}")


def test_sigkills_under_airflow_lose_and_repeat_no_record(tmp_path: Path, spark, kafka_broker, kafka_topic: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(SEED)
    sink_topic = f"{kafka_topic}-out"
    kafka_broker.create_topic(sink_topic, partitions=2)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_broker.bootstrap)  # the generator's and the health's
    spec_path = kafka_spec(tmp_path / "include", kafka_topic, sink_topic)
    data_root = tmp_path / "data"
    spec = load_spec(spec_path)
    layout = Layout(spec, data_root, spec_path.parent)
    plan = compile_plan(spec, layout)
    ingestion = Path(plan.checkpoint(INGEST_FLOW))
    seed = iter(range(SEED, SEED + 100))

    def feed(files: int) -> None:
        assert generate.main(["--spec", str(spec_path), "--data-root", str(data_root), "--files", str(files),
                              "--events-per-file", "40", "--seed", str(next(seed))]) == 0

    def commits() -> int:
        return len(batch_ids(ingestion, "commits"))

    feed(6)
    airflow = Airflow(tmp_path / "airflow", data_root, extra_env={"STREAMS_SPEC_DIR": str(spec_path.parent),
                                                                   "KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap})
    try:
        airflow.start()
        deploy(airflow, "clicks")
        wait_for(lambda: commits() >= 2, "2 committed batches", timeout=300)
        moments = ["mid-batch", "after a commit"]  # the faults test kills at a random time too
        rng.shuffle(moments)
        for n, moment in enumerate(moments, start=1):
            feed(3)
            if moment == "mid-batch":
                wait_for(lambda: (o := batch_ids(ingestion, "offsets")) and (c := batch_ids(ingestion, "commits"))
                         and o[-1] > c[-1], "a batch in flight", timeout=120, every=0.02)
            else:  # right after a commit
                done = commits()
                wait_for(lambda d=done: commits() > d, "a new commit", timeout=120, every=0.02)
            holder = read_holder(layout.lease_dir)
            assert holder is not None and holder.pid in stream_drivers(), "no live driver holds the lease"
            os.kill(holder.pid, signal.SIGKILL)
            killed_at = time.time()
            wait_for(lambda p=holder.pid, t=killed_at: (h := read_holder(layout.lease_dir)) is not None
                     and h.pid != p and any(f.stat().st_mtime > t for f in (ingestion / "commits").glob("[0-9]*")),
                     f"a new driver to commit after SIGKILL {n} ({moment})", timeout=240, every=0.2)
            print(f"SIGKILL {n} ({moment}): first new committed batch after {time.time() - killed_at:.1f}s")
            if n == 1:  # the maintenance DAG compacts the accepted rows and the Delta sink while the stream
                # commits, replays and is killed again
                airflow.unpause("stream_clicks_maintenance")
                run_id = airflow.trigger("stream_clicks_maintenance")
        wait_for(lambda: airflow.client.run("stream_clicks_maintenance", run_id)["state"] in ("success", "failed"),
                 "the maintenance run", timeout=300, every=2)
        maintained = airflow.client.run("stream_clicks_maintenance", run_id)
        assert maintained["state"] == "success", maintained
        wait_for(lambda: assess(plan, layout).status == Status.IDLE, "the stream to take every record", timeout=300,
                 every=2)
    finally:
        airflow.stop()
        for pid in stream_drivers():
            os.kill(pid, signal.SIGKILL)
    one_driver_at_a_time(layout)
    assert kafka.lag(plan.source.kafka, ingestion).total == 0
    compacted_while_streaming(plan, layout, ingestion, maintained)

    # the ground truth: the transform only derives a column, so the spec's own outputs and the
    # quarantine are as without it; the SQL output is checked against its query (agreement)
    records = gt.read_ledger(data_root / "generated" / "clicks" / "ledger.jsonl")
    plain = parse_spec(example_spec("clicks") | {"source": spec.source.model_dump(exclude_none=True)})
    plain_plan = compile_plan(plain, layout)
    expected = gt.expected(plain_plan, records) | {"generator": {"ledger": None}}
    report = verify.compare(spark, plain_plan, expected)
    assert [r.name for r in report.outputs] == ["views_per_minute", "page_totals"]
    assert report.ok, report.describe()
    assert all(r.actual > 0 for r in report.outputs)
    resolved = analysis.resolve_plan(spark, spec, layout)  # the accepted rows' columns: the transform's
    agreement = verify.agreement(spark, resolved)  # the spec's own query types, over the transform's rows
    assert [r.name for r in agreement] == ["views_per_minute", "page_totals"]
    assert all(r.ok for r in agreement), "\n".join(r.describe() for r in agreement)
    # the windowed SQL output: the windows its last batch's watermark closed, as its query computes them
    accepted_batch(spark, resolved.ingestion).createOrReplaceTempView("accepted")
    product = Path(plan.checkpoint("product_views_5m"))
    watermark = batch_watermark_ms(product, last_batch(product, "commits"))
    want = spark.sql(PRODUCT_VIEWS).where(f"window_end <= timestamp_millis({watermark})").collect()
    got = spark.read.parquet(layout.data("sinks/clicks/product_views_5m")).collect()
    assert want and sorted(map(tuple, got)) == sorted(map(tuple, want))

    # every input record accounted for, as the platform measured it: each committed batch's own
    # "ingested" event (written before its commit) says what it accepted, quarantined and dropped
    # late; Spark's progress event (written after the commit, so a SIGKILL right after a commit
    # loses it) says what it read and what deduplication dropped
    counts = expected["counts"]
    assert counts["input_records"] == len(records) and counts["duplicates"] > 0 and counts["quarantined"] > 0
    checkpoint = read_query_checkpoint(str(ingestion), with_files=False)
    events = [e for e in read_events(layout.events_file) if e.get("id") == checkpoint.query_id
              and isinstance(e.get("batch_id"), int) and e["batch_id"] <= checkpoint.last_committed]
    ingested = {e["batch_id"]: e for e in events if e["event"] == "ingested"}  # a replayed batch: its last run
    progress = {e["batch_id"]: e for e in events if e["event"] == "progress"}
    assert sorted(ingested) == list(range(checkpoint.last_committed + 1))
    for kind, expect in (("accepted", counts["accepted"]), ("quarantined", counts["quarantined"]),
                         ("late", counts["dropped_late"])):
        assert sum(e[kind] for e in ingested.values()) == expect, kind
    unmeasured = sorted(set(ingested) - set(progress))
    read = sum(e["input_rows"] for e in progress.values())
    duplicates = sum(e.get("dropped_duplicates") or 0 for e in progress.values())
    print(f"batches without a progress event (killed right after their commit): {unmeasured}")
    if not unmeasured:
        assert (read, duplicates) == (counts["input_records"], counts["duplicates"])
    assert read <= counts["input_records"] and duplicates <= counts["duplicates"]
    assert sum(e["rows"] for e in ingested.values()) + counts["duplicates"] == counts["input_records"]

    # the Kafka sink, at least once: a consumer that drops a batch id it has taken reads each record once
    accepted = sorted(r["event_id"] for r in accepted_batch(spark, resolved.ingestion).collect())
    seen: dict[str, list[str]] = {}
    for m in kafka_broker.consume(sink_topic):
        batch = dict(m.headers() or [])[BATCH_HEADER].decode()
        seen.setdefault(batch, []).append(json.loads(m.value())["event_id"])
    taken = sorted(i for ids in seen.values() for i in set(ids))
    assert taken == accepted and len(accepted) == counts["accepted"]
