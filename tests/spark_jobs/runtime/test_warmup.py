"""A standby's rehearsal: the stream's own queries over a sample, in a scratch folder, nothing of the stream written."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from stream_runs import land, make_spec, reading  # tests/stream_runs.py

from spark_jobs import analysis
from spark_jobs.flows import queries as flows
from spark_jobs.plan import compile_plan
from spark_jobs.runtime import warmup
from spark_jobs.stream_spec.layout import Layout, default_spec_dir
from spark_jobs.stream_spec.loading import parse_spec

OUTPUTS = [
    {"name": "rows", "mode": "append", "query": {"type": "passthrough"},
     "sink": {"type": "parquet", "path": "sinks/rows", "partition_by": ["event_date"]}},
    {"name": "windows", "mode": "append", "sink": {"type": "parquet", "path": "sinks/windows"},
     "query": {"type": "aggregate", "window": {"duration": "10 minutes"}, "group_by": ["device_id"],
               "aggregates": [{"name": "n", "fn": "count"}]}},
    {"name": "per_device", "mode": "update", "sink": {"type": "table", "table": "per_device"},
     "query": {"type": "aggregate", "group_by": ["device_id"], "aggregates": [{"name": "n", "fn": "count"}]}},
    {"name": "alerts", "mode": "append", "query": {"type": "passthrough"},
     "sink": {"type": "kafka", "topic": "alerts", "bootstrap_servers": "127.0.0.1:9"}},
]


def stream(tmp_path: Path, landed: int = 2):
    spec = parse_spec(make_spec(OUTPUTS))
    layout = Layout(spec, tmp_path / "data", default_spec_dir())
    landing = Path(compile_plan(spec, layout).source.landing)
    landing.mkdir(parents=True)
    for i in range(landed):
        land(landing, "json", [reading(f"e{i}-{j}", i * 20 + j, device=f"dev-00{1 + j % 2}") for j in range(5)]
             + ["not json"])
    return spec, layout


def strings(value) -> list[str]:
    """Every string a plan holds (its paths, URLs, names)."""
    if isinstance(value, str):
        return [value]
    if dataclasses.is_dataclass(value):
        return [s for f in dataclasses.fields(value) for s in strings(getattr(value, f.name))]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in strings(k) + strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in strings(v)]
    return []


def test_the_scratch_plan_reads_and_writes_only_in_the_scratch_folder(spark, tmp_path: Path) -> None:
    spec, layout = stream(tmp_path)
    plan = analysis.resolve_plan(spark, spec, layout)
    moved = warmup.scratch_plan(plan, tmp_path / "scratch")
    data = str(tmp_path / "data")
    assert any(data in s for s in strings(plan))
    assert [s for s in strings(moved) if data in s] == []
    assert moved.output("per_device").sink.url == f"sqlite:///{tmp_path / 'scratch' / 'tables.db'}"
    assert moved.output("alerts").sink.kind == "parquet"  # no topic written
    assert moved.ingestion.joins == plan.ingestion.joins  # reference data read where it is
    assert [o.name for o in moved.outputs_with_flows] == [o.name for o in plan.outputs_with_flows]


def test_a_rehearsal_runs_every_query_over_a_sample_and_writes_nothing_of_the_stream(spark, tmp_path: Path,
                                                                                      monkeypatch) -> None:
    spec, layout = stream(tmp_path)
    plan = analysis.resolve_plan(spark, spec, layout)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    read: dict[str, int] = {}
    scratch: list[Path] = []
    run = flows.run_available_now

    def counted(spark_, scratch_plan, **kwargs):
        scratch.append(Path(scratch_plan.checkpoint_root).parent)
        finished = run(spark_, scratch_plan, **kwargs)
        read.update({name: sum(p.numInputRows for p in q.recentProgress) for name, q in finished.items()})
        return finished

    monkeypatch.setattr(flows, "run_available_now", counted)
    assert warmup.rehearse(spark, plan, lines=4) is not None
    # every query ran over the first 4 lines of the newest file; the ingestion wrote the rows the outputs read
    assert read == {"_ingest": 4, "windows": 4, "per_device": 4, "alerts": 4}
    assert not scratch[0].exists()
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_nothing_landed_is_nothing_to_rehearse(spark, tmp_path: Path) -> None:
    spec, layout = stream(tmp_path, landed=0)
    assert warmup.rehearse(spark, analysis.resolve_plan(spark, spec, layout)) is None


def test_a_stream_of_a_kafka_topic_rehearses_over_its_last_records_and_keeps_its_offsets(spark, tmp_path: Path,
                                                                                         kafka_broker, kafka_topic,
                                                                                         monkeypatch) -> None:
    data = make_spec(OUTPUTS[:3])
    data["source"] = {"type": "kafka", "bootstrap_servers": kafka_broker.bootstrap, "topics": [kafka_topic],
                      "format": "json", "columns": data["source"]["columns"], "max_offsets_per_trigger": 2}
    spec = parse_spec(data)
    layout = Layout(spec, tmp_path / "data", default_spec_dir())
    kafka_broker.produce(kafka_topic, [reading(f"a{i}", i) for i in range(10)], partition=0)
    kafka_broker.produce(kafka_topic, [reading(f"b{i}", i) for i in range(3)], partition=1)
    plan = analysis.analyze(spark, spec, layout)
    sample = warmup.kafka_sample(plan, records=6)  # two a partition; the empty one from its end
    assert json.loads(sample.kafka.starting_offsets) == {kafka_topic: {"0": 8, "1": 1, "2": -1}}
    assert sample.kafka.max_offsets_per_trigger is None
    read: dict[str, int] = {}
    run = flows.run_available_now

    def counted(spark_, scratch_plan, **kwargs):
        finished = run(spark_, scratch_plan, **kwargs)
        read.update({name: sum(p.numInputRows for p in q.recentProgress) for name, q in finished.items()})
        return finished

    monkeypatch.setattr(flows, "run_available_now", counted)
    assert warmup.rehearse(spark, plan, lines=6) is not None
    assert read == {"_ingest": 4, "windows": 4, "per_device": 4}
    assert not Path(layout.checkpoint_root).exists()  # the stream's own offsets: untouched


def test_the_scratch_folders_of_standbys_killed_while_they_rehearsed_are_swept(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from spark_jobs.runtime.lease import process_start

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead_pid = int(gone.stdout)
    mine = tmp_path / f"rehearsal-s-{os.getpid()}-{process_start(os.getpid())}-abc"
    dead = tmp_path / f"rehearsal-s-{dead_pid}-12345-def"
    other = tmp_path / f"rehearsal-other-{dead_pid}-12345-ghi"
    for folder in (mine, dead, other):
        (folder / "checkpoint").mkdir(parents=True)
    assert warmup.sweep(tmp_path, "s") == [dead]
    assert mine.exists() and other.exists() and not dead.exists()
