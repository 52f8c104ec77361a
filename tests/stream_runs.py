"""Running specs' flows in the tests' shared SparkSession: a spec of readings, files landed whole,
and the stream processed available-now (``run``); what each output holds and each query reported
(``Run``). Shared by the tests of ``spark_jobs/flows`` and of bad input."""

from __future__ import annotations

import itertools
import json
import os
from datetime import datetime, timedelta
from pathlib import Path

from spark_jobs import analysis
from spark_jobs.flows import queries as flows
from spark_jobs.plan import query_name
from spark_jobs.runtime.progress import summarize
from spark_jobs.stream_spec.layout import (
    Layout,
    default_spec_dir,
)
from spark_jobs.stream_spec.loading import parse_spec
from spark_jobs.stream_spec.models import Trigger

T0 = datetime(2026, 1, 1)
_names = itertools.count()


def stream_name() -> str:
    """A stream name no other spec of this test process has."""
    return f"t{next(_names)}"


def at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def reading(event_id: str, minute: float, device: str = "dev-001", temperature: float = 20.0) -> str:
    return json.dumps({"event_id": event_id, "device_id": device, "ts": at(minute), "temperature": temperature})


def make_spec(outputs: list[dict], watermark: str = "10 minutes") -> dict:
    return {
        "name": stream_name(),
        "source": {
            "type": "files", "path": "landing", "format": "json", "max_files_per_trigger": 1,
            "columns": [
                {"name": "event_id", "type": "string", "required": True},
                {"name": "device_id", "type": "string", "required": True},
                {"name": "ts", "type": "timestamp", "required": True},
                {"name": "temperature", "type": "double"},
            ],
        },
        "quarantine": {"path": "quarantine"},
        "enrich": [{
            "name": "devices", "path": "reference/devices.csv", "key": ["device_id"],
            "columns": [{"name": "device_id", "type": "string"}, {"name": "site", "type": "string"}],
        }],
        "event_time": {"column": "ts", "watermark": watermark},
        "deduplicate": {"key": ["event_id"]},
        "outputs": outputs,
        "checkpoint": "checkpoints",
    }


def window_output(name: str, duration: str, slide: str | None = None, mode: str = "append") -> dict:
    return {"name": name, "mode": mode, "sink": {"type": "memory"}, "query": {
        "type": "aggregate", "window": {"duration": duration, "slide": slide}, "group_by": ["device_id"],
        "aggregates": [{"name": "n", "fn": "count"}, {"name": "ids", "fn": "max", "column": "event_id"}]}}


class Run:
    def __init__(self, spark, spec, plan, queries):
        self.spark, self.spec, self.plan, self.queries = spark, spec, plan, queries

    def rows(self, output: str) -> list[dict]:
        table = query_name(self.spec.name, output)
        return [r.asDict() for r in self.spark.table(table).collect()]

    def progress(self, query: str) -> list[dict]:
        return [summarize(json.loads(p.json)) for p in self.queries[query]]

    def total(self, output: str, field: str) -> int:
        return sum(p[field] for p in self.progress(output))


def land(landing: Path, fmt: str, lines: list[str | bytes]) -> None:
    """One file, appearing whole: written under a hidden name (which Spark's file source skips),
    then renamed in, so that a running query never lists it half-written or empty."""
    i = len(list(landing.iterdir()))
    path = landing / f"part-{i:04d}.{fmt}"
    staged = landing / f".{path.name}.landing"
    staged.write_bytes(b"".join((ln if isinstance(ln, bytes) else ln.encode()) + b"\n" for ln in lines))
    ns = 1_700_000_000_000_000_000 + i * 1_000_000_000
    os.utime(staged, ns=(ns, ns))
    os.replace(staged, path)


def run(spark, tmp_path: Path, spec_data: dict, files: list[list[str | bytes]],
        rounds: bool = False, spec_dir: Path | None = None) -> Run:
    """Land the files and process them (available-now); with ``rounds``, the outputs run
    all along and the ingestion takes one file at a time, so an output batch holds one
    file's accepted rows. ``spec_dir``: where the spec would live (default include/streams)."""
    spec = parse_spec(spec_data)
    plan = analysis.resolve_plan(spark, spec, Layout(spec, tmp_path / "data", spec_dir or default_spec_dir()))
    assert plan.source is not None and plan.source.landing is not None
    landing = Path(plan.source.landing)
    landing.mkdir(parents=True)
    if not rounds:
        for lines in files:
            land(landing, spec.source.format, lines)
        return Run(spark, spec, plan, {n: q.recentProgress for n, q in flows.run_available_now(spark, plan).items()})
    ingest: list = []
    outputs = flows.start(spark, plan, Trigger(processing_time="100 milliseconds"), only=lambda name: name != "_ingest")
    try:
        for lines in files:
            land(landing, spec.source.format, lines)
            once = flows.start(spark, plan, Trigger(available_now=True), only=lambda name: name == "_ingest")
            once["_ingest"].awaitTermination(120)
            ingest.extend(once["_ingest"].recentProgress)
            for q in outputs.values():
                q.processAllAvailable()
    finally:
        for q in outputs.values():
            q.stop()
    return Run(spark, spec, plan, {"_ingest": ingest, **{n: q.recentProgress for n, q in outputs.items()}})
